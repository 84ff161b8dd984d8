"""A conv-transpose layer described by its PyTorch hyper-parameters and input size.

The architectures made of conv-transposes (decoder3d, unet3d) list theirs with a
`conv_transposes()` method of their config; their models build their layers from it and the
benchmark reads it (`conv_transposes_of`) for its method choice and roofline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from zoo.layers.conv_transpose import output_shape, torch_padding


@dataclass(frozen=True)
class ConvTransposeSpec:
    """One conv-transpose layer: channels, PyTorch hyper-parameters (one int for every spatial
    dim) and the spatial size of its input."""

    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int
    padding: int
    output_padding: int
    dilation: int
    input_size: tuple[int, ...]
    name: str = ""

    @property
    def per_dim(self) -> tuple[tuple[int, ...], ...]:
        """(kernel_size, stride, padding, output_padding, dilation), each one entry per dim."""
        n = len(self.input_size)
        return tuple((v,) * n for v in (self.kernel_size, self.stride, self.padding,
                                         self.output_padding, self.dilation))

    @property
    def output_size(self) -> tuple[int, ...]:
        """PyTorch's (i - 1)s - 2p + d(k - 1) + op + 1 per dim (ValueError if < 1)."""
        return output_shape(self.input_size, *self.per_dim)

    @property
    def flax_padding(self) -> tuple[tuple[int, int], ...]:
        """The explicit (low, high) padding pairs of the Flax layer."""
        return torch_padding(*self.per_dim)


@runtime_checkable
class HasConvTransposes(Protocol):
    """A config that lists its model's conv-transpose layers."""

    def conv_transposes(self) -> list[ConvTransposeSpec]:
        """The layers with their input sizes, in model order."""
        ...


def conv_transposes_of(config: object) -> list[ConvTransposeSpec]:
    """The conv-transposes `config` lists (`HasConvTransposes`); none if it lists none."""
    if isinstance(config, HasConvTransposes):
        return config.conv_transposes()
    return []
