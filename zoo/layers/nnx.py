"""Flax NNX conv-transpose with a method switch (same parameters as `nnx.ConvTranspose`)."""

from __future__ import annotations

from flax import nnx
from jax import Array

from zoo.layers.conv_transpose import CHOICES
from zoo.layers.flax_common import flax_conv_transpose


class ConvTranspose(nnx.ConvTranspose):
    """`flax.nnx.ConvTranspose` with a `method` switch between exactly-equal formulations.

    Parameters (`kernel` `(*k, in, out)` in correlation form, `bias`) and the explicit `padding`
    pairs are those of `nnx.ConvTranspose` with `transpose_kernel=False`.
    """

    def __init__(self, *args, method: str = "auto", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if method not in CHOICES:
            raise ValueError(f"unknown conv-transpose method {method!r}; use one of "
                             f"{CHOICES}")
        self.method = method

    def __call__(self, inputs: Array) -> Array:
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, bias = self.promote_dtype(
            (inputs, self.kernel[...], bias), dtype=self.dtype
        )
        return flax_conv_transpose(self, inputs, kernel, bias)
