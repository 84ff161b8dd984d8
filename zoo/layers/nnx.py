"""Flax NNX conv-transpose with a method switch (same parameters as `nnx.ConvTranspose`)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from jax import Array

from zoo.layers.conv_transpose import METHODS, conv_transpose
from zoo.layers.padding import flax_to_torch_padding


class ConvTranspose(nnx.ConvTranspose):
    """`flax.nnx.ConvTranspose` with a `method` switch between exactly-equal formulations.

    Parameters (`kernel` `(*k, in, out)` in correlation form, `bias`) and the explicit `padding`
    pairs are those of `nnx.ConvTranspose` with `transpose_kernel=False`.
    """

    def __init__(self, *args, method: str = "auto", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if method not in (*METHODS, "auto"):
            raise ValueError(f"unknown conv-transpose method {method!r}")
        if self.transpose_kernel or self.mask is not None or isinstance(self.padding, str):
            raise ValueError("zoo ConvTranspose needs explicit padding pairs, "
                             "transpose_kernel=False and no mask")
        self.method = method

    def __call__(self, inputs: Array) -> Array:
        n = len(self.kernel_size)
        if inputs.ndim != n + 2:
            raise ValueError(f"ConvTranspose{n}d expects (N, *spatial, C), got {inputs.shape}")
        strides = self.strides if isinstance(self.strides, tuple) else (self.strides or 1,) * n
        dilation = (self.kernel_dilation if isinstance(self.kernel_dilation, tuple)
                    else (self.kernel_dilation or 1,) * n)
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, bias = self.promote_dtype(
            (inputs, self.kernel[...], bias), dtype=self.dtype
        )
        padding, output_padding = flax_to_torch_padding(self.padding, self.kernel_size, dilation)
        sp = "DHW"[-n:]
        y = conv_transpose(
            inputs, kernel, stride=strides, padding=padding, output_padding=output_padding,
            dilation=dilation, dimension_numbers=("N" + sp + "C", sp + "IO", "N" + sp + "C"),
            method=self.method, precision=self.precision,
            preferred_element_type=self.preferred_element_type,
        )
        if bias is not None:
            y = y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
        return y
