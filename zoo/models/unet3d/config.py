"""The 3-D U-Net's configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from zoo.configs import Config, ConfigError, positive
from zoo.layers.conv_transpose import CHOICES
from zoo.layers.conv_transpose_spec import ConvTransposeSpec

# The conversion contract of the decoder: `cat([skip, up])` on the channel axis, so the first
# input channels of `decoders.i.conv1.weight` read the encoder's skip connection.
CONCAT_ORDER: tuple[str, str] = ("skip", "up")


@dataclass(frozen=True)
class UNet3DConfig(Config):
    """A 3-D U-Net of depth `len(widths) - 1`.

    `encoders.i` (i < depth) are two conv3x3x3 (no bias) + norm + relu of width `widths[i]`,
    each followed by a down-sampling by 2 (`down="maxpool"`, or `"conv"`: `downs.i`, a k2 s2
    Conv3d). `bottleneck` has width `widths[-1]`. `ups.i` (deepest first) are ConvTranspose3d
    `widths[depth - i] -> widths[depth - i - 1]` with PyTorch hyper-parameters `up_*` that must
    double the size; `decoders.i` take `cat([skip, up])` (`CONCAT_ORDER`) to
    `widths[depth - i - 1]`; `head` is a 1x1x1 Conv3d. `norm`: BatchNorm (momentum in the Flax
    convention) or GroupNorm of `groups` groups; `norm_eps` for both (PyTorch's 1e-5, not
    Flax's GroupNorm default 1e-6).
    """

    arch: ClassVar[str] = "unet3d"
    TINY: ClassVar[dict[str, Any]] = {"in_channels": 2, "out_channels": 2, "widths": (2, 4),
                                      "input_size": (4, 6, 2)}
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {"gn": {"norm": "group", "groups": 2,
                                                            "down": "conv"}}
    LOSS: ClassVar[str] = "mse"
    in_channels: int = 1
    out_channels: int = 2
    input_size: tuple[int, int, int] = (64, 64, 64)
    widths: tuple[int, ...] = (16, 32, 64, 128)
    norm: Literal["batch", "group"] = "batch"
    groups: int = 8
    norm_eps: float = 1e-5
    bn_momentum: float = 0.9  # Flax convention: weight of the old running value.
    down: Literal["maxpool", "conv"] = "maxpool"
    up_kernel_size: int = 2
    up_stride: int = 2
    up_padding: int = 0
    up_output_padding: int = 0
    up_dilation: int = 1
    conv_method: str = "auto"  # see zoo.layers.conv_transpose.choose_method

    def validate(self) -> None:
        if len(self.widths) < 2:
            raise ConfigError(f"unet3d.widths needs at least 2 entries (encoder stages, then "
                              f"the bottleneck), found {self.widths}")
        positive("unet3d sizes", (self.in_channels, self.out_channels, *self.input_size,
                                  *self.widths, self.groups, self.up_kernel_size,
                                  self.up_stride, self.up_dilation))
        factor = 2 ** self.depth
        if any(s % factor for s in self.input_size):
            raise ConfigError(f"unet3d.input_size {self.input_size} must be a multiple of "
                              f"2^depth = {factor} in every dimension (depth {self.depth})")
        if self.norm == "group" and any(w % self.groups for w in self.widths):
            raise ConfigError(f"unet3d.groups {self.groups} must divide every width, found "
                              f"widths {self.widths}")
        if not 0.0 <= self.bn_momentum < 1.0:
            raise ConfigError(f"unet3d.bn_momentum must be in [0, 1), found {self.bn_momentum}")
        if self.norm_eps <= 0:
            raise ConfigError(f"unet3d.norm_eps must be positive, found {self.norm_eps}")
        if self.conv_method not in CHOICES:
            raise ConfigError(f"unet3d.conv_method must be one of {CHOICES}, "
                              f"found {self.conv_method!r}")
        try:
            sizes = [(spec.input_size, spec.output_size) for spec in self.conv_transposes()]
        except ValueError as e:
            raise ConfigError(f"unet3d up-sampling: {e}") from None
        for size, out in sizes:
            want = tuple(2 * s for s in size)
            if out != want:
                raise ConfigError(
                    f"unet3d up-sampling (up_kernel_size={self.up_kernel_size}, up_stride="
                    f"{self.up_stride}, up_padding={self.up_padding}, up_output_padding="
                    f"{self.up_output_padding}, up_dilation={self.up_dilation}) maps "
                    f"{size} to {out}, not to the skip's {want}")

    @property
    def depth(self) -> int:
        """Number of down-samplings (encoder stages)."""
        return len(self.widths) - 1

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.input_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.out_channels, *self.input_size)

    def decoder_widths(self) -> tuple[int, ...]:
        """Width of `decoders.i` (and output of `ups.i`), deepest first."""
        return tuple(reversed(self.widths[:-1]))

    def conv_transposes(self) -> list[ConvTransposeSpec]:
        """`ups.0` (deepest) to `ups.{depth-1}`, each with its input size."""
        specs = []
        for i, out in enumerate(self.decoder_widths()):
            size = tuple(s // 2 ** (self.depth - i) for s in self.input_size)
            specs.append(ConvTransposeSpec(
                self.widths[self.depth - i], out, self.up_kernel_size, self.up_stride,
                self.up_padding, self.up_output_padding, self.up_dilation, size, f"ups.{i}"))
        return specs
