"""Flax NNX layers: conv-transpose with a method switch (same parameters as
`nnx.ConvTranspose`); multi-head attention whose q/k/v projections may go without a bias."""

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


class MultiHeadAttention(nnx.MultiHeadAttention):
    """`flax.nnx.MultiHeadAttention` with `qkv_bias=False` dropping the query, key and value
    biases while `out` keeps its own (timm's `qkv_bias`; Flax's `use_bias` drops both)."""

    def __init__(self, *args, qkv_bias: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not qkv_bias:
            for proj in (self.query, self.key, self.value):
                proj.use_bias, proj.bias = False, nnx.data(None)
