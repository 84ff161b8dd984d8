"""The ResNet's configuration (torchvision's ResNet, v1.5: the Bottleneck strides its 3x3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from zoo.configs import Axis, Config, ConfigError, Padding, positive
from zoo.models.intermediates import take_indices
from zoo.weights.adaptation import Adapter, AdaptInputConv, ResetClassifier

EXPANSION: dict[str, int] = {"basic": 1, "bottleneck": 4}
STEM: dict[str, tuple[int, int, int, bool]] = {  # conv1 kernel, stride, padding; max-pool
    "imagenet": (7, 2, 3, True), "cifar": (3, 1, 1, False)}
POOL: tuple[int, int, int] = (3, 2, 1)  # the ImageNet stem's max-pool: kernel, stride, padding


def same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """(before, after) padding of Flax/TensorFlow SAME (timm's `pad_type='same'`): the output
    has ceil(size / stride) positions, the odd one of the total goes after (at stride 2 and
    an even size, a 3x3 kernel pads (0, 1) where PyTorch's padding=1 pads (1, 1))."""
    total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


TORCHVISION: dict[str, dict[str, Any]] = {  # torchvision's named ResNets: config overrides
    "resnet18": {},
    "resnet34": {"layers": (3, 4, 6, 3)},
    "resnet50": {"block": "bottleneck", "layers": (3, 4, 6, 3)},
    "resnet101": {"block": "bottleneck", "layers": (3, 4, 23, 3)},
    "resnet152": {"block": "bottleneck", "layers": (3, 8, 36, 3)},
    "resnext50_32x4d": {"block": "bottleneck", "layers": (3, 4, 6, 3), "groups": 32,
                        "width_per_group": 4},
    "wide_resnet50_2": {"block": "bottleneck", "layers": (3, 4, 6, 3), "width_per_group": 128},
}


@dataclass(frozen=True)
class BlockSpec:
    """One residual block: input channels, planes (output = planes x expansion), stride of its
    strided conv, whether its shortcut is a 1x1 conv + BN projection (`downsample`), and the
    channels of its inner convs (`width`: the Bottleneck's grouped 3x3; `planes` in a
    BasicBlock)."""

    in_channels: int
    planes: int
    stride: int
    downsample: bool
    width: int


@dataclass(frozen=True)
class ResNetConfig(Config):
    """torchvision's ResNet: stem, stages `layer1..layerN` of `layers[i]` blocks of width
    `widths[i]` (the first block of every stage but the first strides by 2), average pool, fc.

    Defaults are ResNet-18; `ResNetConfig.named("resnet50")` is ResNet-50. ResNeXt and wide
    ResNets are Bottleneck ResNets whose 3x3 conv has `groups` groups of `width_per_group`
    channels at 64 planes (torchvision's `int(planes * width_per_group / 64) * groups`).
    BatchNorm momentum in the Flax convention (`bn_momentum` = 1 - PyTorch's 0.1).
    `padding`: "torch" (torchvision's symmetric padding, k // 2 on each side) or "same" (the
    official Flax ImageNet example's ResNet: the blocks' convs and the stem's max-pool pad as
    Flax's SAME, `same_pads`; its stem conv keeps the explicit (3, 3) it is written with). The
    weights are the same either way; the outputs differ at even sizes.
    """

    arch: ClassVar[str] = "resnet"
    REFERENCES: ClassVar[dict[str, str]] = {
        "torchvision's ResNet, ResNeXt and Wide ResNet": "tests/test_resnet.py",
        "timm's ResNet": "tests/test_resnet.py",
        "torchvision's keys, shapes and parameter counts": "tests/test_named_models.py",
        "the Flax ImageNet example's ResNet files": "tests/test_flax_imagenet_files.py",
    }
    TINY: ClassVar[dict[str, Any]] = {"stem": "cifar", "layers": (1, 1), "widths": (4, 8),
                                      "stem_width": 4, "input_size": (8, 7), "num_classes": 5}
    # One stage of one Bottleneck behind the ImageNet stem (max-pool; a stride-1 projection).
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {"bottleneck": {
        "block": "bottleneck", "stem": "imagenet", "layers": (1,), "widths": (2,),
        "input_size": (15, 13)},
        # A ResNeXt stage: two blocks whose 3x3 conv has 2 groups of 4 channels.
        "grouped": {"block": "bottleneck", "layers": (2,), "widths": (8,), "groups": 2,
                    "width_per_group": 32}}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = {
        **TORCHVISION,
        "resnet20-cifar": {"stem": "cifar", "layers": (3, 3, 3), "widths": (16, 32, 64),
                           "stem_width": 16, "input_size": (32, 32), "num_classes": 10},
        # The official Flax ImageNet example's ResNet18 ... ResNet200 (its models.py):
        # torchvision's shapes, the convolutions and the max-pool padded as Flax's SAME.
        **{f"{name}-flax": {**TORCHVISION[name], "padding": "same"} for name in (
            "resnet18", "resnet34", "resnet50", "resnet101", "resnet152")},
        "resnet200-flax": {"block": "bottleneck", "layers": (3, 24, 36, 3), "padding": "same"},
    }
    # timm's pretrained adaptations: a new fc for another num_classes, conv1 for another
    # in_channels (the input size changes no weight).
    ADAPTERS: ClassVar[tuple[Adapter, ...]] = (ResetClassifier("fc"),
                                               AdaptInputConv("conv1.weight"))
    LOSS: ClassVar[str] = "cross_entropy"
    # timm's ResNet arguments: its `stem_width` shapes only its deep stems (stem_type 'deep',
    # which the zoo's config has not): the plain stem is 64 wide whatever it says.
    TIMM_ARGS: ClassVar[dict[str, str | None]] = {
        "channels": "widths", "cardinality": "groups", "base_width": "width_per_group",
        "stem_width": None}
    # Flax's SAME or torchvision's padding: a Flax checkpoint into "torch" padding is warned.
    PADDING: ClassVar[Padding] = Padding("padding", same="same")
    block: Literal["basic", "bottleneck"] = "basic"
    layers: tuple[int, ...] = (2, 2, 2, 2)
    widths: tuple[int, ...] = (64, 128, 256, 512)
    stem: Literal["imagenet", "cifar"] = "imagenet"
    stem_width: int = 64
    groups: int = 1  # of the Bottleneck's 3x3 conv
    width_per_group: int = 64
    in_channels: int = 3
    input_size: tuple[int, int] = (224, 224)
    num_classes: int = 1000
    bn_momentum: float = 0.9  # Flax convention: weight of the old running value.
    bn_eps: float = 1e-5
    padding: Literal["torch", "same"] = "torch"

    def validate(self) -> None:
        if not 1 <= len(self.layers) <= 4 or len(self.widths) != len(self.layers):
            raise ConfigError(f"resnet.layers and resnet.widths need 1 to 4 entries each (one "
                              f"per stage), found {self.layers} and {self.widths}")
        positive("resnet sizes", (*self.layers, *self.widths, self.stem_width, self.in_channels,
                                  *self.input_size, self.num_classes, self.groups,
                                  self.width_per_group))
        if self.block == "basic" and (self.groups, self.width_per_group) != (1, 64):
            raise ConfigError(f"resnet: a basic block has groups=1 and width_per_group=64 (as "
                              f"torchvision's), found {self.groups} and {self.width_per_group}")
        if any(self.inner_width(p) < 1 for p in self.widths):
            raise ConfigError(f"resnet: width_per_group {self.width_per_group} leaves no channel "
                              f"per group at widths {self.widths} (int(w * {self.width_per_group}"
                              f" / 64) must be >= 1)")
        if not 0.0 <= self.bn_momentum < 1.0:
            raise ConfigError(f"resnet.bn_momentum must be in [0, 1), found {self.bn_momentum}")
        if self.bn_eps <= 0:
            raise ConfigError(f"resnet.bn_eps must be positive, found {self.bn_eps}")

    @property
    def expansion(self) -> int:
        return EXPANSION[self.block]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.input_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.num_classes,)

    @property
    def stem_conv(self) -> tuple[int, int, int]:
        """conv1's kernel, stride and padding."""
        k, s, p, _ = STEM[self.stem]
        return k, s, p

    def conv_padding(self, padding: int) -> int | str:
        """A conv's padding: torchvision's `padding` on both sides, or "SAME"."""
        return "SAME" if self.padding == "same" else padding

    def pool_padding(self, size: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        """The stem max-pool's (before, after) padding per spatial axis for its input of
        `size` (H, W): PyTorch's `POOL` padding, or Flax's SAME for that size."""
        k, s, p = POOL
        if self.padding != "same":
            return ((p, p), (p, p))
        h, w = size
        return (same_pads(h, k, s), same_pads(w, k, s))

    @property
    def input_axes(self) -> tuple[Axis, ...]:
        """The channels; any height and width (the ResNet pools globally, as torchvision's
        and timm's do at any size)."""
        return (Axis("C", size=self.in_channels), Axis("H"), Axis("W"))

    @property
    def stem_pool(self) -> bool:
        """Whether the stem ends with the max-pool `POOL`."""
        return STEM[self.stem][3]

    def inner_width(self, planes: int) -> int:
        """Channels of a block's inner convs (torchvision: `int(planes * base_width / 64) *
        groups` in a Bottleneck)."""
        if self.block == "basic":
            return planes
        return int(planes * (self.width_per_group / 64.0)) * self.groups

    def convs(self, spec: BlockSpec) -> tuple[tuple[int, int, int, int, int], ...]:
        """A block's convs `conv1, conv2, ...` (each followed by its BatchNorm `bn1, ...`) as
        (in, out, kernel, stride, groups): torchvision's BasicBlock (3x3 strided, 3x3) or
        Bottleneck (1x1, 3x3 strided and grouped, 1x1 to `planes x expansion`)."""
        w, out = spec.width, spec.planes * self.expansion
        if self.block == "basic":
            return (spec.in_channels, w, 3, spec.stride, 1), (w, w, 3, 1, 1)
        return ((spec.in_channels, w, 1, 1, 1), (w, w, 3, spec.stride, self.groups),
                (w, out, 1, 1, 1))

    @property
    def num_stages(self) -> int:
        return len(self.layers)

    def taps(self, indices: int | Sequence[int] | None, stop_early: bool = False,
             intermediates_only: bool = False) -> tuple[list[int], int]:
        """`forward_intermediates`' taps (`take_indices`) and the last: 0 after the stem's
        ReLU (before the max-pool), i after stage i - 1 (as timm's)."""
        return take_indices(1 + self.num_stages, indices)

    @property
    def features(self) -> int:
        """Channels entering `fc`."""
        return self.widths[-1] * self.expansion

    def stages(self) -> tuple[tuple[BlockSpec, ...], ...]:
        """The blocks of `layer1..layerN`, as torchvision's `_make_layer` builds them."""
        out, channels = [], self.stem_width
        for i, (n, planes) in enumerate(zip(self.layers, self.widths, strict=True)):
            stride = 1 if i == 0 else 2
            blocks = []
            for j in range(n):
                s = stride if j == 0 else 1
                blocks.append(BlockSpec(channels, planes, s,
                                        s != 1 or channels != planes * self.expansion,
                                        self.inner_width(planes)))
                channels = planes * self.expansion
            out.append(tuple(blocks))
        return tuple(out)
