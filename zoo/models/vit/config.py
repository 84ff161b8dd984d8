"""The ViT's configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from zoo.adapters import Adapter, AdaptInputConv, ResamplePosEmbed, ResetClassifier
from zoo.configs import Config, ConfigError, positive


@dataclass(frozen=True)
class ViTConfig(Config):
    """timm's `VisionTransformer`: patch embedding, prefix tokens, blocks, pooling, head.

    The defaults are timm's `vit_tiny_patch16_224` (224x224, patch 16, width 192, depth 12,
    3 heads, MLP 768, 1000 classes, LayerNorm epsilon 1e-6, biases on qkv, class-token
    pooling). timm's options, with its names and meaning: `global_pool` ("token" or "avg" over
    the patch tokens), `fc_norm` (None: timm's default, a LayerNorm after an "avg" pool in
    place of the final `norm`), `class_token`, `reg_tokens` (register tokens after the class
    token), `no_embed_class` (the position embedding covers the patches only), `pre_norm`
    (`norm_pre` before the blocks; the patch embedding then has no bias), `qkv_bias`,
    `init_values` (LayerScale `ls1`/`ls2.gamma`, None: none).
    """

    arch: ClassVar[str] = "vit"
    TINY: ClassVar[dict[str, Any]] = {"image_size": (8, 8), "patch_size": 4, "in_channels": 3,
                                      "width": 8, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0,
                                      "num_classes": 5}
    # timm's options on: average pooling with fc_norm, no class token, register tokens, the
    # position embedding on patches only, norm_pre, no qkv bias, LayerScale.
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {"options": {
        "global_pool": "avg", "class_token": False, "reg_tokens": 2, "no_embed_class": True,
        "pre_norm": True, "qkv_bias": False, "init_values": 0.1}}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = {
        f"vit_{size}_patch{patch}_{image}": {
            "width": width, "depth": depth, "num_heads": heads, "patch_size": patch,
            "image_size": (image, image)}
        for size, (width, depth, heads) in {"tiny": (192, 12, 3), "small": (384, 12, 6),
                                            "base": (768, 12, 12),
                                            "large": (1024, 24, 16)}.items()
        for patch in (16, 32) for image in (224, 384)
        if (size, patch) != ("tiny", 32)}  # the combinations timm has
    # timm's pretrained adaptations: a new head for another num_classes, the position embedding
    # resampled for another image_size, the patch projection for another in_channels.
    ADAPTERS: ClassVar[tuple[Adapter, ...]] = (
        ResetClassifier("head"), ResamplePosEmbed("pos_embed"),
        AdaptInputConv("patch_embed.proj.weight"))
    LOSS: ClassVar[str] = "cross_entropy"
    TIMM_ARGS: ClassVar[dict[str, str | None]] = {"embed_dim": "width"}
    image_size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    in_channels: int = 3
    width: int = 192
    depth: int = 12
    num_heads: int = 3
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    norm_eps: float = 1e-6  # timm's (PyTorch's LayerNorm default is 1e-5, Flax's 1e-6)
    global_pool: Literal["token", "avg"] = "token"
    fc_norm: bool | None = None
    class_token: bool = True
    reg_tokens: int = 0
    no_embed_class: bool = False
    pre_norm: bool = False
    qkv_bias: bool = True
    init_values: float | None = None

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
        if self.fc_norm not in (None, True, False):
            raise ConfigError(f"vit.fc_norm must be true, false or null, found {self.fc_norm!r}")
        if self.init_values is not None and (isinstance(self.init_values, bool) or not
                                             isinstance(self.init_values, int | float)):
            raise ConfigError(f"vit.init_values must be a number or null, found "
                              f"{self.init_values!r}")
        if self.reg_tokens < 0:
            raise ConfigError(f"vit.reg_tokens must be >= 0, found {self.reg_tokens}")
        if self.global_pool == "token" and not self.class_token:
            raise ConfigError("vit: global_pool='token' needs class_token=True (timm's rule)")

    @property
    def grid(self) -> tuple[int, int]:
        """Patches per image side (rows, columns)."""
        h, w = self.image_size
        return (h // self.patch_size, w // self.patch_size)

    @property
    def num_prefix_tokens(self) -> int:
        """The class token (if any) and the register tokens, before the patches."""
        return int(self.class_token) + self.reg_tokens

    @property
    def seq_len(self) -> int:
        """Tokens per image: the prefix tokens and the patches."""
        return self.grid[0] * self.grid[1] + self.num_prefix_tokens

    @property
    def embed_len(self) -> int:
        """Rows of the position embedding: the patches, plus the prefix tokens unless
        `no_embed_class`."""
        return self.seq_len - (self.num_prefix_tokens if self.no_embed_class else 0)

    @property
    def use_fc_norm(self) -> bool:
        """Whether a LayerNorm `fc_norm` follows the pool (and the final `norm` is left out)."""
        return self.global_pool == "avg" if self.fc_norm is None else self.fc_norm

    @property
    def mlp_hidden(self) -> int:
        return int(self.width * self.mlp_ratio)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.image_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.num_classes,)
