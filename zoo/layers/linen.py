"""Flax Linen conv-transpose with a method switch (same parameters as `nn.ConvTranspose`)."""

from __future__ import annotations

import flax.linen as nn
from jax import Array

from zoo.layers.flax_common import flax_conv_transpose


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
        if not isinstance(self.kernel_size, tuple):
            raise ValueError(f"kernel_size must be a tuple, got {self.kernel_size!r}")
        kernel = self.param("kernel", self.kernel_init,
                            (*self.kernel_size, inputs.shape[-1], self.features), self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        return flax_conv_transpose(self, inputs, kernel, bias)
