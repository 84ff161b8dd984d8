"""ConvNeXt's configuration (timm's `ConvNeXt`, v1 and v2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, ClassVar

import numpy as np

from zoo.configs import Axis, Config, ConfigError, positive
from zoo.models.intermediates import take_indices
from zoo.weights.adaptation import Adapter, AdaptInputConv, ResetClassifier

# timm's named models: depths and widths per stage; the small ones ("atto" to "nano") run their
# MLP as 1x1 convolutions on channels-first maps (`conv_mlp`), as timm builds them.
_SIZES: dict[str, tuple[tuple[int, ...], tuple[int, ...], bool]] = {
    "atto": ((2, 2, 6, 2), (40, 80, 160, 320), True),
    "femto": ((2, 2, 6, 2), (48, 96, 192, 384), True),
    "pico": ((2, 2, 6, 2), (64, 128, 256, 512), True),
    "nano": ((2, 2, 8, 2), (80, 160, 320, 640), True),
    "tiny": ((3, 3, 9, 3), (96, 192, 384, 768), False),
    "small": ((3, 3, 27, 3), (96, 192, 384, 768), False),
    "base": ((3, 3, 27, 3), (128, 256, 512, 1024), False),
    "large": ((3, 3, 27, 3), (192, 384, 768, 1536), False),
}
V2_SIZES = ("atto", "femto", "pico", "nano", "tiny", "small", "base")  # timm's, to base


def linspace_f32(stop: float, n: int) -> tuple[float, ...]:
    """`torch.linspace(0, stop, n).tolist()` exactly (float32, as PyTorch's CPU kernel: a
    float32 step, each value `step * i` from the start or `stop - step * (n - 1 - i)` from the
    end, rounded once), the drop path rates timm draws its blocks' from."""
    if n == 1:
        return (0.0,)
    end = np.float32(stop)
    step = np.float64(np.float32(end / np.float32(n - 1)))
    return tuple(float(np.float32(step * i if i < n // 2 else np.float64(end) - step * (n - 1 - i)))
                 for i in range(n))


@dataclass(frozen=True)
class ConvNeXtConfig(Config):
    """timm's `ConvNeXt` with its parameter names: a patch stem (`stem.0` conv of kernel and
    stride `patch_size`, `stem.1` LayerNorm2d), stages `stages.i` of `depths[i]` blocks of width
    `dims[i]` (each but the first after a `downsample`: LayerNorm2d, 2x2 conv of stride 2), and
    the head: global average pool, `head.norm`, `head.fc`.

    A block (`stages.i.blocks.j`): `conv_dw` (depthwise `kernel_size`, padding k // 2),
    `norm` (LayerNorm), `mlp.fc1` (to `mlp_ratio` x the width), GELU, `mlp.grn` (v2's
    GlobalResponseNorm, `use_grn`), `mlp.fc2`, layer scale `gamma` (timm's `ls_init_value`;
    None: none, as v2), drop path, residual. The MLP runs on channels-last maps as Linear layers
    (timm's default) or, `conv_mlp`, as 1x1 convolutions on channels-first ones with
    LayerNorm2d (timm's atto ... nano). Drop path rates rise linearly from 0 at the first
    block to `drop_path_rate` at the last (timm's). The defaults are convnext_tiny; one to four
    stages (timm's have four).
    """

    arch: ClassVar[str] = "convnext"
    REFERENCES: ClassVar[dict[str, str]] = {
        "timm's ConvNeXt (v1, v2)": "tests/test_convnext.py",
        "torchvision's ConvNeXt": "tests/test_convnext.py",
    }
    TINY: ClassVar[dict[str, Any]] = {"depths": (1, 1), "dims": (4, 8), "input_size": (12, 10),
                                      "num_classes": 5}
    # v2 (GRN, no layer scale) with timm's small models' 1x1-convolution MLP.
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {
        "v2": {"use_grn": True, "ls_init_value": None, "conv_mlp": True}}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = {
        **{f"convnext_{size}": {"depths": d, "dims": w, "conv_mlp": c}
           for size, (d, w, c) in _SIZES.items()},
        **{f"convnextv2_{size}": {"depths": _SIZES[size][0], "dims": _SIZES[size][1],
                                  "conv_mlp": _SIZES[size][2], "use_grn": True,
                                  "ls_init_value": None} for size in V2_SIZES},
    }
    # timm's pretrained adaptations: a new head.fc for another num_classes, the stem conv for
    # another in_channels (the input size changes no weight).
    ADAPTERS: ClassVar[tuple[Adapter, ...]] = (ResetClassifier("head.fc"),
                                               AdaptInputConv("stem.0.weight"))
    LOSS: ClassVar[str] = "cross_entropy"
    depths: tuple[int, ...] = (3, 3, 9, 3)
    dims: tuple[int, ...] = (96, 192, 384, 768)
    patch_size: int = 4
    kernel_size: int = 7
    mlp_ratio: float = 4.0
    conv_mlp: bool = False
    use_grn: bool = False
    ls_init_value: float | None = 1e-6
    norm_eps: float = 1e-6
    drop_path_rate: float = 0.0
    in_channels: int = 3
    input_size: tuple[int, int] = (224, 224)
    num_classes: int = 1000

    def validate(self) -> None:
        if not 1 <= len(self.depths) <= 4 or len(self.dims) != len(self.depths):
            raise ConfigError(f"convnext.depths and convnext.dims need 1 to 4 entries each (one "
                              f"per stage), found {self.depths} and {self.dims}")
        positive("convnext sizes", (*self.depths, *self.dims, self.patch_size, self.kernel_size,
                                    self.in_channels, *self.input_size, self.num_classes))
        if len(self.input_size) != 2:
            raise ConfigError(f"convnext.input_size must have 2 entries, found "
                              f"{self.input_size}")
        if self.kernel_size % 2 == 0:
            raise ConfigError(f"convnext.kernel_size must be odd (padded k // 2 on each side, "
                              f"as timm's), found {self.kernel_size}")
        if self.mlp_ratio <= 0 or min(self.mlp_hidden(d) for d in self.dims) < 1:
            raise ConfigError(f"convnext.mlp_ratio must give a positive hidden width, found "
                              f"{self.mlp_ratio}")
        if self.ls_init_value is not None and (isinstance(self.ls_init_value, bool) or not
                                               isinstance(self.ls_init_value, int | float)):
            raise ConfigError(f"convnext.ls_init_value must be a number or null, found "
                              f"{self.ls_init_value!r}")
        if not self.norm_eps > 0:
            raise ConfigError(f"convnext.norm_eps must be positive, found {self.norm_eps}")
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise ConfigError(f"convnext.drop_path_rate must be in [0, 1), found "
                              f"{self.drop_path_rate}")

    def mlp_hidden(self, dim: int) -> int:
        """The MLP's hidden width of a block of width `dim` (timm's `int(mlp_ratio * dim)`)."""
        return int(self.mlp_ratio * dim)

    @property
    def layer_scale(self) -> bool:
        """Whether the blocks hold a layer scale `gamma`."""
        return self.ls_init_value is not None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.input_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.num_classes,)

    @property
    def min_size(self) -> int:
        """The smallest height and width: the stem's patch, then a 2x2 downsampling per stage
        after the first (each needs a map of at least 2x2; PyTorch floors the rest, as timm's)."""
        return self.patch_size * 2 ** (len(self.depths) - 1)

    @property
    def input_axes(self) -> tuple[Axis, ...]:
        """The channels; any height and width from `min_size` (the model pools globally; a
        size that is no multiple of the strides is floored at each, as in timm's)."""
        return (Axis("C", size=self.in_channels), Axis("H", minimum=self.min_size),
                Axis("W", minimum=self.min_size))

    @property
    def num_stages(self) -> int:
        return len(self.depths)

    def taps(self, indices: int | Sequence[int] | None, stop_early: bool = False,
             intermediates_only: bool = False) -> tuple[list[int], int]:
        """`forward_intermediates`' taps (`take_indices` of the stages) and the last: i after
        stage i - 1 (timm's taps no stem)."""
        take, last = take_indices(self.num_stages, indices)
        return [i + 1 for i in take], last + 1

    @property
    def features(self) -> int:
        """Channels entering the head."""
        return self.dims[-1]

    def drop_path_rates(self) -> tuple[tuple[float, ...], ...]:
        """Each stage's blocks' drop path rates: `drop_path_rate * i / (blocks - 1)` over all
        blocks in order, in float32 as timm's (`torch.linspace(...).split(depths)`)."""
        rates = linspace_f32(self.drop_path_rate, sum(self.depths))
        starts = np.cumsum((0, *self.depths)).tolist()
        return tuple(rates[a:b] for a, b in pairwise(starts))
