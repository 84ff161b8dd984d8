"""What the decoder-only language models share in every JAX library: the causal mask, attention
with grouped key/value heads, and the rotary position code, each as `transformers` computes it.

- **Mask** (`causal_mask`): key `j` is visible from query `i` when `j <= i` (their indices in
  the sequence, not their position ids, as `transformers`' `create_causal_mask`), within a
  sliding window `i - j < window` (Mistral), and not padding (`attention_mask[j] == 0`). The
  indices are explicit so that a KV cache can pass the indices of its slots.
- **Attention** (`attend`): `softmax(q k^T * scale)` (soft-capped, `cap * tanh(s / cap)`, when
  the model caps its scores: Gemma 2) over the visible keys, the logits and the
  softmax in float32 (or wider) whatever the inputs' dtype, the weights cast back, then `v`.
  Query head `h` reads key/value head `h // (heads / kv_heads)` (`transformers`' `repeat_kv`:
  grouped-query attention). A masked key gets the lowest float as its logit (`transformers`'
  eager mask), so a query that sees nothing (a left-padding position) attends uniformly instead
  of producing NaN, and its output, which nothing valid reads, stays finite.
- **Rotary embedding** (`rope_frequencies`, `rotary`): `transformers`' convention, which pairs
  dimension `i` with `i + head_dim / 2` (`rotate_half`), with its inverse frequencies (and the
  Llama 3 rescaling, `rope_type="llama3"`) computed in float32 as `transformers` does. Meta's
  original checkpoints pair interleaved dimensions instead; `transformers`' conversion permutes
  their q/k rows once, so weights in `transformers`' layout need no permutation here.
- **KV cache** (`sequence_mask`, `write_cache`): each library keeps its keys and values in
  arrays preallocated to the cache's length and writes a call's tokens at the cache's index
  (`lax.dynamic_update_slice`: one program for every step); the call's queries are the slots
  `index .. index + L - 1` and its keys every slot, `attention_mask` covering them all
  (`zoo.runtime.generation` states the protocol).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

__all__ = ["attend", "causal_mask", "default_positions", "rope_frequencies", "rotary",
           "sequence_mask", "softcap", "write_cache"]


def causal_mask(q_index: Array, kv_index: Array, kv_valid: Array | None = None,
                window: int | None = None, causal: bool = True) -> Array:
    """`(..., Lq, Lk)` booleans: which keys each query sees. `q_index` `(Lq,)` and `kv_index`
    `(Lk,)` are the indices in the sequence; `kv_valid` `(..., Lk)` (the attention mask, 1 for
    a token, 0 for padding) leads the result's batch axes. `causal=False` (an encoder): every
    key but the padding."""
    q, k = q_index[:, None], kv_index[None, :]
    visible = k <= q if causal else jnp.ones((q.shape[0], k.shape[1]), bool)
    if window is not None:
        visible = visible & (k > q - window)
    if kv_valid is None:
        return visible
    valid = kv_valid.astype(bool)[..., None, :]
    return jnp.broadcast_to(visible, valid.shape[:-2] + visible.shape) & valid


def sequence_mask(length: int, attention_mask: Array | None = None,
                  window: int | None = None, index: Array | int = 0,
                  kv_length: int | None = None, causal: bool = True) -> Array:
    """The causal (or, `causal=False`, padding-only) mask of a call on `length` tokens standing
    at slots `index ..` of a sequence of `kv_length` slots (default: the call's own tokens,
    `index` 0); `attention_mask` `(..., kv_length)` marks the padding among them."""
    kv_length = length if kv_length is None else kv_length
    return causal_mask(index + jnp.arange(length), jnp.arange(kv_length), attention_mask,
                       window, causal)


def write_cache(cache: Array, new: Array, index: Array | int, axis: int) -> Array:
    """`cache` with `new` written at `index` along the sequence `axis` (same program for
    every index)."""
    return jax.lax.dynamic_update_slice_in_dim(cache, new.astype(cache.dtype), index, axis)


def default_positions(length: int) -> Array:
    """`transformers`' position ids when none are given: `0 .. length - 1`, whatever the
    padding (a left-padded batch passes its own, e.g. `cumsum(mask) - 1`)."""
    return jnp.arange(length, dtype=jnp.int32)


def positions(attention_mask: Any) -> Any:
    """The position ids `transformers`' `generate` gives a (left-)padded batch: each token
    counted from the first token of its sequence (`cumsum(mask) - 1`), 1 at padding (never
    read). Works on NumPy, JAX and PyTorch arrays alike."""
    counted = attention_mask.cumsum(-1) - 1
    return counted * (attention_mask != 0) + (attention_mask == 0) * 1


def _float32_or_wider(dtype: Any) -> jnp.dtype:
    with jax.numpy_dtype_promotion("standard"):
        return jnp.result_type(dtype, jnp.float32)


def softcap(x: Array, cap: float | None) -> Array:
    """`cap * tanh(x / cap)` (transformers' soft-capping of scores and logits); `x` if None."""
    return x if cap is None else jnp.tanh(x / cap) * cap


def attend(q: Array, k: Array, v: Array, mask: Array, scale: float,
           dropout: Callable[[Array], Array] | None = None, cap: float | None = None) -> Array:
    """Attention over `(..., L, heads, D)` queries and `(..., Lk, kv_heads, D)` keys and values
    (grouped: `heads` a multiple of `kv_heads`); `mask` `(..., Lq, Lk)` (or `(Lq, Lk)`) from
    `causal_mask`; `dropout` (training) applies to the attention weights; `cap` soft-caps the
    scaled scores (`softcap`) before the mask. Returns `(..., L, heads, D)`."""
    *lead, lq, heads, d = q.shape
    kv_heads = k.shape[-2]
    groups = heads // kv_heads
    # Head-major for the two batched products: (..., kv_heads, groups, Lq, D) by
    # (..., kv_heads, Lk, D).
    qh = jnp.moveaxis(q.reshape(*lead, lq, kv_heads, groups, d), -4, -2)
    kh, vh = jnp.swapaxes(k, -2, -3), jnp.swapaxes(v, -2, -3)
    logits = jnp.einsum("...grqd,...gkd->...grqk", qh, kh)
    logits = (logits * scale).astype(_float32_or_wider(logits.dtype))  # scaled as transformers
    logits = softcap(logits, cap)
    m = mask.reshape((*mask.shape[:-2], 1, 1, *mask.shape[-2:]))
    m = m.reshape((1,) * (logits.ndim - m.ndim) + m.shape)
    logits = jnp.where(m, logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    if dropout is not None:
        weights = dropout(weights)
    out = jnp.einsum("...grqk,...gkd->...grqd", weights, vh)  # (..., kv_heads, groups, Lq, D)
    return jnp.moveaxis(out, -2, -4).reshape(*lead, lq, heads, d)


def rope_frequencies(head_dim: int, theta: float, rope_type: str = "default",
                     factor: float = 1.0, low_freq_factor: float = 1.0,
                     high_freq_factor: float = 4.0, original_max_position_embeddings: int = 8192
                     ) -> np.ndarray:
    """The rotary inverse frequencies `(head_dim / 2,)` in float32, as `transformers` computes
    them (`_compute_default_rope_parameters`, `_compute_linear_scaling_rope_parameters`,
    `_compute_llama3_parameters`)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv = np.float32(1.0) / (np.float32(theta) ** exponents)
    if rope_type == "default":
        return inv.astype(np.float32)
    if rope_type == "linear":  # positions divided by `factor`: so are the frequencies
        return (inv / np.float32(factor)).astype(np.float32)
    if rope_type != "llama3":
        raise ValueError(f"unknown rope_type {rope_type!r}; known: 'default', 'linear', "
                         "'llama3'")
    low_wavelen = original_max_position_embeddings / low_freq_factor
    high_wavelen = original_max_position_embeddings / high_freq_factor
    wavelen = np.float32(2 * math.pi) / inv
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv)
    smooth = ((np.float32(original_max_position_embeddings) / wavelen - np.float32(low_freq_factor))
              / np.float32(high_freq_factor - low_freq_factor))
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _rotate_half(x: Array) -> Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotary(x: Array, positions: Array, inv_freq: np.ndarray) -> Array:
    """`x` `(..., L, heads, D)` rotated by the angles `position * inv_freq` of each token
    (`positions` `(..., L)`, integers), in `transformers`' half-split convention: the angles in
    float32, their cosines and sines cast to `x`'s dtype, `x * cos + rotate_half(x) * sin`.
    Its first `2 * len(inv_freq)` dimensions are rotated, the others passed through
    (transformers' partial rotary)."""
    freq = jnp.asarray(inv_freq).reshape((1,) * positions.ndim + (-1,))
    angles = positions.astype(jnp.float32)[..., None] * freq  # (..., L, R / 2)
    angles = jnp.concatenate([angles, angles], axis=-1)[..., None, :]  # (..., L, 1, R)
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    r = angles.shape[-1]
    rotated, passed = x[..., :r], x[..., r:]
    out = rotated * cos + _rotate_half(rotated) * sin
    return out if passed.shape[-1] == 0 else jnp.concatenate([out, passed], axis=-1)
