"""A mixture of experts' arithmetic in JAX, shared by the Equinox, Linen and NNX layers:
transformers' routing (`route`: softmax, top-k, the weights renormalised to sum 1 when asked)
and two computations of the experts' gated MLPs `down(act(gate(x)) * up(x))` that agree:

- `dense_experts`, the reference: every expert on every token, weighted by the routing
  weights (zero for the experts a token was not sent to);
- `sorted_experts`, the dispatch: the `(token, expert)` pairs sorted by expert, each expert's
  contiguous rows multiplied by its own weights in one grouped matmul (`jax.lax.ragged_dot`,
  group sizes from a histogram: no capacity, no dropped token, static shapes), the rows put
  back in token order and summed with their weights. `top_k / num_experts` of the reference's
  FLOPs.

The experts' arrays are stacked on a leading expert axis, `(E, in, out)` here (Flax's kernel
layout): `gate_up` `(E, hidden, 2 * width)` (gate first, then up, as transformers' fused
`gate_up_proj`), `down` `(E, width, hidden)`. `load_balancing_loss` is transformers'
`load_balancing_loss_func` (Switch Transformer's auxiliary loss)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Activation = Callable[[jax.Array], jax.Array]


def route(logits: jax.Array, top_k: int, normalize: bool) -> tuple[jax.Array, jax.Array]:
    """The routing of tokens `(T, E)` router logits: `(weights (T, k) float32, experts (T, k)
    int32)`, the `top_k` largest softmax probabilities (float32), divided by their sum when
    `normalize`."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts.astype(jnp.int32)


def _combine(y: jax.Array, weights: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """`sum_k weights[t, k] * y[t, k]` in float32 (transformers' weights are float32), cast to
    `dtype`."""
    return jnp.einsum("tkh,tk->th", y.astype(jnp.float32), weights).astype(dtype)


def dense_experts(x: jax.Array, weights: jax.Array, experts: jax.Array, gate_up: jax.Array,
                  down: jax.Array, act: Activation) -> jax.Array:
    """The reference: every expert's MLP on every token `x` `(T, hidden)`, each token's
    outputs weighted by its routing `weights` / `experts` `(T, k)` (others by zero)."""
    h = jnp.einsum("th,ehi->eti", x, gate_up)
    gate, up = jnp.split(h, 2, axis=-1)
    y = jnp.einsum("eti,eih->teh", act(gate) * up, down)  # (T, E, hidden)
    dense = jnp.sum(jax.nn.one_hot(experts, gate_up.shape[0], dtype=jnp.float32)
                    * weights[..., None], axis=1)  # (T, E)
    return jnp.einsum("teh,te->th", y.astype(jnp.float32), dense).astype(x.dtype)


def sorted_experts(x: jax.Array, weights: jax.Array, experts: jax.Array, gate_up: jax.Array,
                   down: jax.Array, act: Activation) -> jax.Array:
    """The dispatch: the `T * k` (token, expert) rows sorted by expert, one grouped matmul
    per projection (`ragged_dot`), the rows unsorted and summed with their weights."""
    tokens, k = experts.shape
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=gate_up.shape[0]).astype(jnp.int32)
    rows = x[order // k]  # (T * k, hidden), grouped by expert
    gate, up = jnp.split(jax.lax.ragged_dot(rows, gate_up, sizes), 2, axis=-1)
    y = jax.lax.ragged_dot(act(gate) * up, down, sizes)
    y = y[jnp.argsort(order)].reshape(tokens, k, -1)  # back in (token, choice) order
    return _combine(y, weights, x.dtype)


DISPATCHES: dict[str, Callable[..., jax.Array]] = {"dense": dense_experts,
                                                   "sorted": sorted_experts}


def load_balancing_loss(router_logits: jax.Array, top_k: int,
                        mask: jax.Array | None = None) -> jax.Array:
    """transformers' `load_balancing_loss_func`: router logits `(N, layers, L, E)` (the sparse
    layers'), `mask` `(N, L)` (0: padding, left out); `E * sum_e f_e * P_e` with `f_e` the
    fraction of top-k choices and `P_e` the mean probability of expert `e` over every layer's
    tokens."""
    n, layers, length, e = router_logits.shape
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
    _, chosen = jax.lax.top_k(probs, top_k)
    counts = jnp.sum(jax.nn.one_hot(chosen, e, dtype=jnp.float32), axis=-2)
    m = (jnp.ones((n, length), jnp.float32) if mask is None
         else mask.astype(jnp.float32))[:, None, :, None]
    rows = jnp.sum(m) * layers
    tokens_per_expert = jnp.sum(counts * m, axis=(0, 1, 2)) / rows
    prob_per_expert = jnp.sum(probs * m, axis=(0, 1, 2)) / rows
    return e * jnp.sum(tokens_per_expert * prob_per_expert)
