"""The decode loop of the JAX libraries, written once over a library's pure decoding step
(`Prepared`): a prefill of the prompt, then one token per step, each sequence stopping on its
own at EOS and padded after it.

Slots: the prompt `(N, L)` (left-padded) fills the cache's slots `0 .. L-1`, the `t`-th new
token slot `L + t`, as `transformers`' cache positions; the attention mask covers every slot
(the prompt's mask, then 1 for each token fed back) and the position of a new token is one
past its sequence's last (`cumsum(mask) - 1`, `transformers`' `generate`).

Three call styles, the same arithmetic: `compiled` (prefill and a `lax.while_loop` over the
steps in one program), `python` (a jitted step per token from Python, the cache donated) and
`flat` (the same step jitted on the flat list of the weights' leaves: `jax.jit`'s floor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from zoo.generation.sampling import next_token
from zoo.generation.settings import Settings
from zoo.models.language import positions

# apply(weights, cache, ids (N, l), mask (N, max_length), positions (N, l)) -> (logits, cache)
Apply = Callable[[Any, Any, Array, Array, Array], tuple[Array, Any]]


@dataclass(frozen=True)
class Prepared:
    """A library's decoding step, pure: `apply` (see `Apply`), the model's `weights` and an
    empty `cache` of the batch (both pytrees of arrays) of `max_length` slots."""

    apply: Apply
    weights: Any
    cache: Any
    max_length: int


class State(NamedTuple):
    """The loop's carry: the sequences so far `(N, L + new)`, the mask of the cache's slots
    `(N, max_length)`, the last token's position `(N,)`, the cache, which sequences are done,
    how many tokens were generated and the sampling key."""

    tokens: Array
    mask: Array
    position: Array
    cache: Any
    done: Array
    step: Array
    key: Array


class Generator:
    """The jitted prefill, step and whole loop of one prepared model and batch shape."""

    def __init__(self, prepared: Prepared, settings: Settings) -> None:
        self.prepared, self.settings = prepared, settings
        self.prefill = jax.jit(self._prefill)
        self.step = jax.jit(self._step, donate_argnums=1)
        self.compiled = jax.jit(self._loop)
        leaves, self._treedef = jax.tree.flatten(prepared.weights)
        self.flat_weights = leaves
        self.flat_step = jax.jit(
            lambda leaves, state: self._step(jax.tree.unflatten(self._treedef, leaves), state),
            donate_argnums=1)

    # ------------------------------------------------------------------ the arithmetic
    def _choose(self, logits: Array, key: Array, step: Array, done: Array) -> Array:
        s = self.settings
        token = next_token(logits, jax.random.fold_in(key, step), s)
        return jnp.where(done, s.pad_token_id, token)

    def _finished(self, token: Array) -> Array:
        eos = self.settings.eos_token_ids
        return jnp.isin(token, jnp.asarray(eos)) if eos else jnp.zeros(token.shape, bool)

    def _prefill(self, weights: Any, cache: Any, ids: Array, mask: Array) -> State:
        """The prompt through the model, and the first new token (at least one is asked)."""
        n, length = ids.shape
        new = self.settings.max_new_tokens
        slots = jnp.zeros((n, self.prepared.max_length), jnp.int32)
        slots = slots.at[:, :length].set(mask)
        pos = positions(mask)
        logits, cache = self.prepared.apply(weights, cache, ids, slots, pos)
        key = jax.random.key(self.settings.seed)
        done = jnp.zeros((n,), bool)
        token = self._choose(logits[:, -1], key, jnp.int32(0), done)
        tokens = jnp.zeros((n, length + new), jnp.int32).at[:, :length].set(ids)
        tokens = tokens.at[:, length].set(token)
        return State(tokens, slots, pos[:, -1], cache, self._finished(token), jnp.int32(1), key)

    def _step(self, weights: Any, state: State) -> State:
        """Feed the last token back, choose the next."""
        prompt = state.tokens.shape[1] - self.settings.max_new_tokens
        slot = prompt + state.step - 1
        last = jax.lax.dynamic_slice_in_dim(state.tokens, slot, 1, axis=1)
        mask = jax.lax.dynamic_update_slice_in_dim(
            state.mask, jnp.ones_like(last), slot, axis=1)
        position = state.position + 1
        logits, cache = self.prepared.apply(weights, state.cache, last, mask, position[:, None])
        token = self._choose(logits[:, -1], state.key, state.step, state.done)
        tokens = jax.lax.dynamic_update_slice_in_dim(state.tokens, token[:, None], slot + 1,
                                                     axis=1)
        return State(tokens, mask, position, cache, state.done | self._finished(token),
                     state.step + 1, state.key)

    def _loop(self, weights: Any, cache: Any, ids: Array, mask: Array) -> State:
        new = self.settings.max_new_tokens
        return jax.lax.while_loop(
            lambda s: (s.step < new) & ~jnp.all(s.done),
            lambda s: self._step(weights, s),
            self._prefill(weights, cache, ids, mask))

    # ------------------------------------------------------------------ the call styles
    def run(self, ids: Array, mask: Array, style: str = "compiled") -> State:
        """The final state of generating after the prompt `ids`, `mask` `(N, L)` in `style`
        ("compiled", "python" or "flat")."""
        p = self.prepared
        if style == "compiled":
            return self.compiled(p.weights, p.cache, ids, mask)
        if style not in ("python", "flat"):
            raise ValueError(f"style must be 'compiled', 'python' or 'flat', got {style!r}")
        step, weights = ((self.step, p.weights) if style == "python"
                         else (self.flat_step, self.flat_weights))
        state = self.prefill(p.weights, p.cache, ids, mask)
        stops = bool(self.settings.eos_token_ids)
        for _ in range(self.settings.max_new_tokens - 1):
            if stops and bool(jnp.all(state.done)):
                break
            state = step(weights, state)
        return state

    def __call__(self, ids: Any, mask: Any, style: str = "compiled") -> Array:
        """The sequences `(N, L + generated)`: prompt and new tokens, as `transformers`'
        `generate` returns them (shorter than `max_new_tokens` when every sequence stopped)."""
        ids, mask = jnp.asarray(ids), jnp.asarray(mask)
        if self.settings.max_new_tokens == 0:
            return ids
        state = self.run(ids, mask, style)
        return state.tokens[:, :ids.shape[1] + int(state.step)]

