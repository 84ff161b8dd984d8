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

Compiled once (`generate`, under `zoo.generate`): a `Generator` is kept per model structure and
settings (the seed, the weights' values and the shapes aside: the weights, the cache and the
sampling key are its programs' arguments, so `jax.jit` keeps one program per batch, cache
length and dtype), and a prompt is left-padded to a bucket (`bucket`) whose cache length is
fixed, so that a new prompt length reuses the programs of its bucket.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from zoo.layers.causal import positions
from zoo.runtime.generation.sampling import next_token
from zoo.runtime.generation.settings import Settings

# apply(weights, cache, ids (N, l), mask (N, max_length), positions (N, l)) -> (logits, cache)
Apply = Callable[[Any, Any, Array, Array, Array], tuple[Array, Any]]


@dataclass(frozen=True)
class Prepared:
    """A library's decoding step, pure: `apply` (see `Apply`), the model's `weights` and an
    empty `cache` of the batch (both pytrees of arrays) of `max_length` slots. `program`: what
    `apply` closes over, hashable (the model's structure without its arrays: two models equal
    in it share their compiled programs), or None (never shared)."""

    apply: Apply
    weights: Any
    cache: Any
    max_length: int
    program: Hashable | None = None


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
    """The jitted prefill, step and whole loop of one prepared model and settings; the weights,
    the cache and the sampling key are arguments (one program per shape, kept by `jax.jit`)."""

    def __init__(self, prepared: Prepared, settings: Settings) -> None:
        self.prepared, self.settings = prepared, settings
        self.prefill = jax.jit(self._prefill)
        self.step = jax.jit(self._step, donate_argnums=1)
        self.compiled = jax.jit(self._loop)
        self._treedef = jax.tree.structure(prepared.weights)
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

    def _prefill(self, weights: Any, cache: Any, ids: Array, slots: Array, key: Array) -> State:
        """The prompt `ids` `(N, L)` through the model (`slots` `(N, max_length)`: the prompt's
        mask, then zeros), and the first new token (at least one is asked)."""
        n, length = ids.shape
        new = self.settings.max_new_tokens
        pos = positions(slots[:, :length])
        logits, cache = self.prepared.apply(weights, cache, ids, slots, pos)
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

    def _loop(self, weights: Any, cache: Any, ids: Array, slots: Array, key: Array) -> State:
        new = self.settings.max_new_tokens
        return jax.lax.while_loop(
            lambda s: (s.step < new) & ~jnp.all(s.done),
            lambda s: self._step(weights, s),
            self._prefill(weights, cache, ids, slots, key))

    # ------------------------------------------------------------------ the call styles
    def run(self, ids: Any, mask: Any, style: str = "compiled",
            prepared: Prepared | None = None, seed: int | None = None) -> State:
        """The final state of generating after the prompt `ids`, `mask` `(N, L)` in `style`
        ("compiled", "python" or "flat") with the weights and the empty cache of `prepared`
        (default: this generator's; another model of the same `program`) and `seed` (default:
        the settings')."""
        if style not in ("compiled", "python", "flat"):
            raise ValueError(f"style must be 'compiled', 'python' or 'flat', got {style!r}")
        p = self.prepared if prepared is None else prepared
        weights, cache = p.weights, p.cache
        mask = np.asarray(mask, np.int32)
        slots = np.zeros((mask.shape[0], p.max_length), np.int32)
        slots[:, :mask.shape[1]] = mask
        key = jax.random.key(self.settings.seed if seed is None else seed)
        ids = jax.device_put(np.asarray(ids, np.int32))  # (jnp.asarray compiles a copy)
        if style == "compiled":
            return self.compiled(weights, cache, ids, slots, key)
        step, args = ((self.step, weights) if style == "python"
                      else (self.flat_step, jax.tree.leaves(weights)))
        state = self.prefill(weights, cache, ids, slots, key)
        stops = bool(self.settings.eos_token_ids)
        for _ in range(self.settings.max_new_tokens - 1):
            if stops and bool(jnp.all(state.done)):
                break
            state = step(args, state)
        return state

    def __call__(self, ids: Any, mask: Any, style: str = "compiled") -> Array:
        """The sequences `(N, L + generated)`: prompt and new tokens, as `transformers`'
        `generate` returns them (shorter than `max_new_tokens` when every sequence stopped)."""
        if self.settings.max_new_tokens == 0:
            return jax.device_put(np.asarray(ids))
        state = self.run(ids, mask, style)
        length = np.shape(ids)[1]
        return jax.device_put(np.asarray(state.tokens)[:, :length + int(state.step)])


SMALLEST_BUCKET = 8  # the shortest padded prompt
KEPT = 16  # generators `shared` keeps (the least recently used goes first)
_SHARED: OrderedDict[Hashable, Generator] = OrderedDict()


def bucket(length: int, room: int | None = None) -> int:
    """The length a prompt of `length` tokens is left-padded to: the next power of two (at
    least `SMALLEST_BUCKET`), at most `room` (the cache's slots the prompt may take)."""
    padded = max(SMALLEST_BUCKET, 1 << (length - 1).bit_length())
    return padded if room is None else max(length, min(padded, room))


def shared(prepared: Prepared, settings: Settings) -> Generator:
    """The generator of `prepared`'s program under `settings`, kept across calls: one per
    model structure (`Prepared.program`, the weights' tree) and settings other than the seed
    and the cache's length (its programs take them as arguments and shapes). It holds no
    model's arrays: pass the call's own to `Generator.run`."""
    if prepared.program is None:
        return Generator(prepared, settings)
    key = (prepared.program, jax.tree.structure(prepared.weights),
           dataclasses.replace(settings, seed=0, max_length=None))
    gen = _SHARED.pop(key, None)
    if gen is None:
        gen = Generator(prepared, settings)
        gen.prepared = dataclasses.replace(prepared, weights=None, cache=None)
    _SHARED[key] = gen
    while len(_SHARED) > KEPT:
        _SHARED.popitem(last=False)
    return gen


def generate(decoding: Callable[[int, int], Prepared], ids: np.ndarray, mask: np.ndarray,
             settings: Settings, limit: int | None = None, style: str = "compiled") -> Array:
    """`zoo.generate` of a JAX library: the sequences `(N, L + generated)` after the prompt
    `ids`, `mask` `(N, L)`, `decoding(batch, max_length)` giving the model's `Prepared` step
    (`limit`: the model's positions). The prompt is left-padded to its `bucket` and the cache
    sized to the bucket (unless `settings.max_length` fixes it), so that prompts of one bucket
    share their compiled programs (`shared`)."""
    n, length = ids.shape
    slots = settings.cache_length(length, limit)  # checks the arguments
    new = settings.max_new_tokens
    if new == 0:
        return jax.device_put(ids)
    if settings.max_length is not None:  # a fixed cache: the prompt's room in it
        room = slots - new
    else:
        room = None if limit is None else limit - new
    padded = bucket(length, room)
    if settings.max_length is None:
        slots = padded + new
    pad = ((0, 0), (padded - length, 0))
    prepared = decoding(n, slots)
    state = shared(prepared, settings).run(np.pad(ids, pad), np.pad(mask, pad), style,
                                           prepared, settings.seed)
    tokens = np.asarray(state.tokens)[:, padded - length:padded + int(state.step)]
    return jax.device_put(tokens)  # (slicing on the device would compile per length)
