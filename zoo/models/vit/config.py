"""The ViT's configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zoo.configs import Config, ConfigError, positive


@dataclass(frozen=True)
class ViTConfig(Config):
    """timm's `VisionTransformer` with a class token and a linear head on it.

    The defaults are timm's `vit_tiny_patch16_224` (224x224, patch 16, width 192, depth 12,
    3 heads, MLP 768, 1000 classes, LayerNorm epsilon 1e-6, biases on qkv).
    """

    arch: ClassVar[str] = "vit"
    TINY: ClassVar[dict[str, Any]] = {"image_size": (8, 8), "patch_size": 4, "in_channels": 3,
                                      "width": 8, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0,
                                      "num_classes": 5}
    LOSS: ClassVar[str] = "cross_entropy"
    image_size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    in_channels: int = 3
    width: int = 192
    depth: int = 12
    num_heads: int = 3
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    norm_eps: float = 1e-6  # timm's (PyTorch's LayerNorm default is 1e-5, Flax's 1e-6)

    def validate(self) -> None:
        if len(self.image_size) != 2:
            raise ConfigError(f"vit.image_size must have 2 entries, found {self.image_size}")
        positive("vit sizes", (*self.image_size, self.patch_size, self.in_channels, self.width,
                               self.depth, self.num_heads, self.num_classes))
        if any(s % self.patch_size for s in self.image_size):
            raise ConfigError(f"vit.image_size {self.image_size} must be a multiple of "
                              f"patch_size {self.patch_size}")
        if self.width % self.num_heads:
            raise ConfigError(f"vit.width {self.width} must be a multiple of num_heads "
                              f"{self.num_heads}")
        if self.mlp_ratio <= 0 or self.mlp_hidden < 1:
            raise ConfigError(f"vit.mlp_ratio must give a positive hidden size, found "
                              f"{self.mlp_ratio}")
        if not self.norm_eps > 0:
            raise ConfigError(f"vit.norm_eps must be positive, found {self.norm_eps}")

    @property
    def grid(self) -> tuple[int, int]:
        """Patches per image side (rows, columns)."""
        h, w = self.image_size
        return (h // self.patch_size, w // self.patch_size)

    @property
    def seq_len(self) -> int:
        """Tokens per image: the patches and the class token."""
        return self.grid[0] * self.grid[1] + 1

    @property
    def mlp_hidden(self) -> int:
        return int(self.width * self.mlp_ratio)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.image_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.num_classes,)
