"""The attention function the Flax ViTs give their attention layers (`attention_fn`).

Flax's own `dot_product_attention` computes the softmax in the inputs' dtype (bfloat16 in a
bfloat16 model) unless told otherwise, and Linen and NNX differ in how to tell it. This one
computes what `equinox.nn.MultiheadAttention` and timm compute: the query scaled by
1/sqrt(head_dim), logits in the inputs' dtype, the softmax in float32 (at least), the weights cast
back, no mask and no dropout.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array


def dot_product_attention(query: Array, key: Array, value: Array, mask: Array | None = None,
                          dropout_rate: float = 0.0, deterministic: bool = True,
                          dtype: Any = None, precision: Any = None, *,
                          logits_bias: Array | None = None, **unused: Any) -> Array:
    """softmax(q k^T / sqrt(D) + logits_bias) v over `(..., seq, heads, D)` inputs (Flax's
    `attention_fn` signature; `mask` and training-mode dropout are refused). `logits_bias`:
    added to the logits `(..., heads, q, k)` (its trailing axes; a Swin window's relative
    position bias and shift mask), as PyTorch's additive `attn_mask`."""
    if mask is not None or (dropout_rate > 0.0 and not deterministic):
        raise ValueError("zoo dot_product_attention: mask and dropout are not supported")
    if dtype is not None:
        query, key, value = (a.astype(dtype) for a in (query, key, value))
    query = query / jnp.sqrt(query.shape[-1]).astype(query.dtype)
    # Head-major `(..., heads, seq, D)` for the two batched products, then back: XLA:CPU runs
    # them as plain batched GEMMs, where the `(..., seq, heads, D)` einsums cost the ViT-cifar
    # attention 1.6x the time forward (3.05 vs 1.86 ms) and 1.15x with gradients (2 cores, idle).
    query, key, value = (jnp.swapaxes(a, -2, -3) for a in (query, key, value))
    logits = jnp.einsum("...hqd,...hkd->...hqk", query, key, precision=precision)
    if logits_bias is not None:  # explicit rank: the leading axes broadcast
        bias = logits_bias.astype(logits.dtype)
        logits = logits + bias.reshape((1,) * (logits.ndim - bias.ndim) + bias.shape)
    weights = jax.nn.softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)))
    out = jnp.einsum("...hqk,...hkd->...hqd", weights.astype(logits.dtype), value,
                     precision=precision)
    return jnp.swapaxes(out, -2, -3)
