"""What the Linen and NNX layers share: Flax padding pairs, conv-transposes, LayerNorm."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jax import Array

from zoo.layers import norm
from zoo.layers.conv_transpose import conv_transpose


def flax_to_torch_padding(
    pairs: Sequence[tuple[int, int]], kernel_size: Sequence[int], dilation: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Invert `torch_padding`: pairs `(d(k-1) - p, d(k-1) - p + op)` -> `(p, op)` per dim.

    Raises ValueError for string padding or pairs no PyTorch layer can express.
    """
    if isinstance(pairs, str) or any(not isinstance(p, tuple | list) for p in pairs):
        raise ValueError(f"explicit (low, high) padding pairs required, got {pairs!r}")
    padding = tuple(d * (k - 1) - lo for (lo, _), k, d in zip(pairs, kernel_size, dilation,
                                                              strict=True))
    output_padding = tuple(hi - lo for lo, hi in pairs)
    if any(op < 0 for op in output_padding):
        raise ValueError(f"padding pairs {pairs} have high < low: not a PyTorch conv-transpose")
    return padding, output_padding


def _per_dim(value: int | Sequence[int] | None, n: int) -> tuple[int, ...]:
    return (value or 1,) * n if value is None or isinstance(value, int) else tuple(value)


def flax_conv_transpose(layer: Any, inputs: Array, kernel: Array, bias: Array | None) -> Array:
    """Apply a Flax-style conv-transpose `layer` (Linen or NNX; its hyper-parameters are read
    from the layer) to channels-last `inputs` with `kernel` `(*k, I, O)` and `bias`."""
    n = len(layer.kernel_size)
    if inputs.ndim != n + 2:
        raise ValueError(f"ConvTranspose{n}d expects (N, *spatial, C), got {inputs.shape}")
    if layer.transpose_kernel or layer.mask is not None:
        raise ValueError("zoo ConvTranspose needs transpose_kernel=False and no mask")
    dilation = _per_dim(layer.kernel_dilation, n)
    padding, output_padding = flax_to_torch_padding(layer.padding, layer.kernel_size, dilation)
    sp = "DHW"[-n:]
    y = conv_transpose(
        inputs, kernel, stride=_per_dim(layer.strides, n), padding=padding,
        output_padding=output_padding, dilation=dilation,
        dimension_numbers=("N" + sp + "C", sp + "IO", "N" + sp + "C"), method=layer.method,
        precision=layer.precision, preferred_element_type=layer.preferred_element_type,
    )
    return y if bias is None else y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))


def check_layer_norm(layer: Any, mask: Array | None) -> None:
    """The zoo's Flax LayerNorms normalise over the last axis with a two-pass variance."""
    last = (-1, (-1,))
    if (mask is not None or layer.reduction_axes not in last or layer.feature_axes not in last
            or layer.axis_name is not None or layer.use_fast_variance):
        raise ValueError("zoo LayerNorm: only the last axis, no mask, no axis_name and "
                         "use_fast_variance=False are supported")


def layer_norm(x: Array, scale: Array | None, bias: Array | None, epsilon: float,
               dtype: Any) -> Array:
    """Flax's LayerNorm over the last axis (`zoo.layers.norm.layer_norm`); the output in
    `dtype`, else in the promoted dtype of `x` and the parameters (as Flax's)."""
    out_dtype = dtype or jnp.result_type(x, *(p for p in (scale, bias) if p is not None))
    return norm.layer_norm(x, 1, epsilon, scale, bias, out_dtype)


def check_rms_norm(layer: Any, mask: Array | None) -> None:
    """The zoo's Flax RMSNorms normalise over the last axis, on one device's values."""
    last = (-1, (-1,))
    if (mask is not None or layer.reduction_axes not in last or layer.feature_axes not in last
            or layer.axis_name is not None):
        raise ValueError("zoo RMSNorm: over the last axis only, without mask or axis_name")
