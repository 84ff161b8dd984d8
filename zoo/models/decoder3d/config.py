"""The 3-D decoder's configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zoo.configs import Config, ConfigError, positive
from zoo.layers.conv_transpose import CHOICES
from zoo.layers.conv_transpose_spec import ConvTransposeSpec


@dataclass(frozen=True)
class Decoder3DConfig(Config):
    """A 3-D upsampling decoder: ConvTranspose3d + relu stages, then a ConvTranspose3d head.

    One stage `ups.i` per entry of `channels` (any number, none included) maps latent_channels
    -> channels[0] -> ... -> channels[-1], the head maps the last to out_channels. The per-layer
    tuples (kernel_size, stride, padding, output_padding, dilation) have one entry per
    conv-transpose (stages, then the head), with PyTorch semantics.
    """

    arch: ClassVar[str] = "decoder3d"
    TINY: ClassVar[dict[str, Any]] = {"latent_channels": 6, "latent_size": (2, 3, 2),
                                      "channels": (5, 4, 3), "out_channels": 2}
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {"odd": dict(
        kernel_size=(3, 5, 3, 1), stride=(2, 3, 1, 1), padding=(1, 2, 2, 0),
        output_padding=(1, 2, 0, 0), dilation=(1, 2, 2, 1), conv_method="pad")}
    LOSS: ClassVar[str] = "mse"
    latent_channels: int = 32
    latent_size: tuple[int, int, int] = (8, 8, 8)
    channels: tuple[int, ...] = (16, 8, 4)
    out_channels: int = 4
    kernel_size: tuple[int, ...] = (4, 4, 4, 3)
    stride: tuple[int, ...] = (2, 2, 2, 1)
    padding: tuple[int, ...] = (1, 1, 1, 1)
    output_padding: tuple[int, ...] = (0, 0, 0, 0)
    dilation: tuple[int, ...] = (1, 1, 1, 1)
    conv_method: str = "auto"  # see zoo.layers.conv_transpose.choose_method

    def validate(self) -> None:
        if self.conv_method not in CHOICES:
            raise ConfigError(f"decoder3d.conv_method must be one of {CHOICES}, "
                              f"found {self.conv_method!r}")
        n = len(self.channels) + 1
        for name in ("kernel_size", "stride", "padding", "output_padding", "dilation"):
            if len(getattr(self, name)) != n:
                raise ConfigError(
                    f"decoder3d.{name} needs {n} entries (one per conv-transpose: "
                    f"{n - 1} stage(s), then the head), found {getattr(self, name)}"
                )
        positive("decoder3d.channels", self.channels)
        positive("decoder3d sizes", (self.latent_channels, *self.latent_size, self.out_channels,
                                     *self.kernel_size, *self.stride, *self.dilation))
        for i, (s, d, op) in enumerate(zip(self.stride, self.dilation, self.output_padding,
                                           strict=True)):
            if not 0 <= op < max(s, d):
                raise ConfigError(
                    f"decoder3d layer {i}: output_padding {op} must be < max(stride, dilation)"
                )
        try:
            self.conv_transposes()
        except ValueError as e:
            raise ConfigError(f"decoder3d: {e}") from None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.latent_channels, *self.latent_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.out_channels, *self.conv_transposes()[-1].output_size)

    def layer_names(self) -> tuple[str, ...]:
        """The conv-transposes' canonical names: the stages `ups.i`, then `head`."""
        return (*(f"ups.{i}" for i in range(len(self.channels))), "head")

    def conv_transposes(self) -> list[ConvTransposeSpec]:
        """Stages then head, each with its input size (ValueError if a size drops below 1)."""
        ins = (self.latent_channels, *self.channels)
        outs = (*self.channels, self.out_channels)
        specs, size = [], tuple(self.latent_size)
        for name, i, o, k, s, p, op, d in zip(
                self.layer_names(), ins, outs, self.kernel_size, self.stride, self.padding,
                self.output_padding, self.dilation, strict=True):
            spec = ConvTransposeSpec(i, o, k, s, p, op, d, size, name)
            size = spec.output_size
            specs.append(spec)
        return specs
