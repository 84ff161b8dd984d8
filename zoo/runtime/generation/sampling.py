"""The next token from the last logits, in JAX: greedy (`argmax`, the first of equal ones, as
`torch.argmax`), or drawn after `transformers`' logits processors in its order (temperature,
top-k, top-p)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array

from zoo.runtime.generation.settings import Settings


def filtered(logits: Array, settings: Settings) -> Array:
    """`(N, vocab)` float32 logits over the temperature, tokens outside the top `top_k` and
    outside the smallest set of probability `top_p` at minus infinity."""
    logits = logits.astype(jnp.float32) / settings.temperature
    if settings.top_k:
        kth = jax.lax.top_k(logits, min(settings.top_k, logits.shape[-1]))[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if settings.top_p < 1.0:
        ascending = jnp.sort(logits, axis=-1)
        mass = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
        dropped = jnp.sum(mass <= 1 - settings.top_p, axis=-1, keepdims=True)
        cutoff = jnp.take_along_axis(ascending, jnp.minimum(dropped, logits.shape[-1] - 1),
                                     axis=-1)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return logits


def next_token(logits: Array, key: Array, settings: Settings) -> Array:
    """`(N,)` int32 tokens from `(N, vocab)` logits."""
    if settings.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, filtered(logits, settings), axis=-1).astype(jnp.int32)
