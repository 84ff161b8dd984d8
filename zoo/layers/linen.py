"""Flax Linen conv-transpose with a method switch (same parameters as `nn.ConvTranspose`)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
from jax import Array

from zoo.layers.conv_transpose import conv_transpose
from zoo.layers.padding import flax_to_torch_padding


class ConvTranspose(nn.ConvTranspose):
    """`flax.linen.ConvTranspose` with a `method` switch between exactly-equal formulations.

    Parameters (`kernel` of shape `(*k, in, out)` in correlation form, `bias`), names and the
    explicit `padding` pairs are those of `nn.ConvTranspose` with `transpose_kernel=False`.
    Pass `kernel_size` as a tuple and `padding` as explicit pairs (see
    `zoo.layers.conv_transpose.torch_padding`).
    """

    method: str = "auto"

    @nn.compact
    def __call__(self, inputs: Array) -> Array:
        if (not isinstance(self.kernel_size, tuple) or self.transpose_kernel
                or self.mask is not None):
            raise ValueError("zoo ConvTranspose needs a tuple kernel_size, "
                             "transpose_kernel=False and no mask")
        n = len(self.kernel_size)
        if inputs.ndim != n + 2:
            raise ValueError(f"ConvTranspose{n}d expects (N, *spatial, C), got {inputs.shape}")
        strides = self.strides or (1,) * n
        dilation = self.kernel_dilation or (1,) * n
        kernel = self.param("kernel", self.kernel_init,
                            (*self.kernel_size, inputs.shape[-1], self.features), self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
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
