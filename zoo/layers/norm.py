"""LayerNorm's normalisation with its gradient in closed form, for every library's LayerNorm.

`normalize(x, n, eps)` is `(x - mean) / sqrt(var + eps)` over the last `n` axes (two-pass
variance, statistics in float32 or wider). Its custom VJP is the textbook gradient,

    dx = rsqrt(var + eps) * (g - mean(g) - x_hat * mean(g * x_hat)),

instead of the chain of means, subtractions and `rsqrt` that autodiff differentiates. Through a
stack of residual blocks, XLA:CPU's fusions of the autodiff chain grow with depth squared (a
16-block residual/LayerNorm/matmul stack: 959 fusion operands in all; 495 with this gradient,
31.7 against 48.7 ms per gradient), and the ViT training step ran 0.82x the time
(docs/investigations/cpu_training_step.md). The values are the same up to float rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import Array

__all__ = ["global_response_norm", "layer_norm", "normalize", "offset_rms_norm", "rms_norm"]


def _stats_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """The dtype the statistics are computed in: `dtype` promoted to at least float32."""
    with jax.numpy_dtype_promotion("standard"):
        return jnp.result_type(dtype, jnp.float32)


def _forward(x: Array, n: int, eps: float) -> tuple[Array, Array]:
    axes = tuple(range(-n, 0))
    x = x.astype(_stats_dtype(x.dtype))
    centred = x - x.mean(axes, keepdims=True)
    inv = jax.lax.rsqrt((centred * centred).mean(axes, keepdims=True) + eps)
    return centred * inv, inv


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def normalize(x: Array, n: int, eps: float) -> Array:
    """`x` normalised over its last `n` axes, in `x`'s dtype promoted to at least float32."""
    return _forward(x, n, eps)[0]


def _normalize_fwd(x: Array, n: int, eps: float) -> tuple[Array, tuple[Array, Array, Array]]:
    x_hat, inv = _forward(x, n, eps)
    return x_hat, (x_hat, inv, jnp.zeros((), x.dtype))


def _normalize_bwd(n: int, eps: float, res: tuple[Array, Array, Array], g: Array
                   ) -> tuple[Array]:
    del eps
    x_hat, inv, like = res
    axes = tuple(range(-n, 0))
    g = g.astype(x_hat.dtype)
    dx = inv * (g - g.mean(axes, keepdims=True)
                - x_hat * (g * x_hat).mean(axes, keepdims=True))
    return (dx.astype(like.dtype),)


normalize.defvjp(_normalize_fwd, _normalize_bwd)


def layer_norm(x: Array, n: int, eps: float, scale: Array | None, bias: Array | None,
               dtype: jnp.dtype) -> Array:
    """`normalize(x, n, eps) * scale + bias` in `dtype`: what every library's LayerNorm
    computes, with `scale` and `bias` shaped as `x`'s last `n` axes (or None)."""
    y = normalize(x, n, eps)
    lead = tuple(range(y.ndim - n))
    if scale is not None:
        y = y * jnp.expand_dims(scale.astype(y.dtype), lead)
    if bias is not None:
        y = y + jnp.expand_dims(bias.astype(y.dtype), lead)
    return y.astype(dtype)


def _l2_norm(x: Array, axes: tuple[int, ...]) -> Array:
    """`sqrt(sum(x**2))` over `axes` (kept), whose gradient at an all-zero slice is 0 as
    PyTorch's `norm` gives (not NaN): GELU gives exact zeros, and a 1x1 map is one value."""
    sq = jnp.sum(x * x, axes, keepdims=True)
    positive = sq > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1)), 0)


def global_response_norm(x: Array, weight: Array, bias: Array, eps: float,
                         channel_axis: int) -> Array:
    """ConvNeXt V2's GRN as timm's `GlobalResponseNorm` computes it, for every library:
    `x + (bias + weight * (x * n))` with `n = g / (mean_c(g) + eps)` and `g` the L2 norm of
    each channel over the spatial axes (every axis but the channel axis and the first, the
    batch; per sample, Equinox's, every axis but the channel axis when `x` has no batch:
    call it under `vmap` with a leading axis, as the layers do)."""
    channel_axis %= x.ndim
    spatial = tuple(a for a in range(1, x.ndim) if a != channel_axis)
    g = _l2_norm(x, spatial)
    n = g / (g.mean(channel_axis, keepdims=True) + eps)
    shape = [1] * x.ndim
    shape[channel_axis] = -1
    return x + (bias.reshape(shape) + weight.reshape(shape) * (x * n))


def rms_norm(x: Array, eps: float, scale: Array | None) -> Array:
    """transformers' RMSNorm over the last axis: `x * rsqrt(mean(x^2) + eps)` computed in
    float32 (or wider), cast back to `x`'s dtype, then times `scale` (the dtype their product
    promotes to, as `weight * x.to(input_dtype)` in PyTorch)."""
    y = x.astype(_stats_dtype(x.dtype))
    y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + eps)
    y = y.astype(x.dtype)
    if scale is None:
        return y
    return jnp.expand_dims(scale, tuple(range(y.ndim - 1))) * y


def offset_rms_norm(x: Array, eps: float, weight: Array) -> Array:
    """transformers' `GemmaRMSNorm` over the last axis: `x * rsqrt(mean(x^2) + eps)` times
    `1 + weight`, all in float32 (or wider), then cast back to `x`'s dtype (a zero weight is
    the plain normalisation)."""
    dtype = _stats_dtype(x.dtype)
    y = x.astype(dtype)
    y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + eps)
    scale = jnp.expand_dims(1 + weight.astype(dtype), tuple(range(y.ndim - 1)))
    return (y * scale).astype(x.dtype)
