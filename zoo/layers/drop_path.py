"""Drop path (stochastic depth), timm's `drop_path` in the three JAX libraries.

In training, a residual branch is dropped for whole samples: each sample is kept with
probability `keep = 1 - rate`, and a kept branch is scaled by `1 / keep` (timm's
`scale_by_keep=True`): `x * (mask / keep)` with one Bernoulli draw per sample. In evaluation
(and at `rate == 0`) it is the identity. The layers: `EqxDropPath` (per sample), `LinenDropPath`,
`NNXDropPath` (batched) and PyTorch's `zoo.layers.torch.DropPath`.

**One mask from one key in every JAX library.** Sample `i` is kept by
`bernoulli(split(key, N)[i], keep)`. A batched layer (Linen, NNX) given `key` draws the mask
of its `N` samples that way (`keep_mask`); the Equinox layer, called per sample, draws with the
key it is given, and `zoo.interface("eqx").apply` hands sample `i` the key `split(key, N)[i]`
under `vmap`: the same raw key gives bitwise the same mask in all three. A batched layer also
takes `N` keys, one per sample (a model that derives each block's per-sample key, as an
Equinox model does from its sample's key: `block_keys`). PyTorch's generator is another
stream, so the PyTorch layer takes an injected mask (`DropPath.keep`) for equivalence tests.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import flax.linen as nn
import jax
from flax import nnx
from jaxtyping import Array, PRNGKeyArray

__all__ = ["EqxDropPath", "LinenDropPath", "NNXDropPath", "block_keys", "drop_path",
           "keep_mask", "sample_keep"]


def sample_keep(key: PRNGKeyArray, rate: float) -> Array:
    """Whether one sample's branch is kept: `bernoulli(key, 1 - rate)` (a scalar bool)."""
    return jax.random.bernoulli(key, 1.0 - rate)


def _keys_shape(key: PRNGKeyArray) -> tuple[int, ...]:
    """The shape of an array of keys: typed keys (`jax.random.key`) or raw uint32 ones
    (`jax.random.PRNGKey`, whose last axis holds the key data)."""
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    return tuple(key.shape) if typed else tuple(key.shape[:-1])


def keep_mask(key: PRNGKeyArray, batch: int, rate: float) -> Array:
    """The `(batch,)` keep mask (bools) of a batch: sample `i` drawn with `split(key,
    batch)[i]`, the key the Equinox interface gives sample `i`. `key` may instead hold `batch`
    keys, one per sample (keys of shape `(batch,)`)."""
    shape = _keys_shape(key)
    if shape not in ((), (batch,)):
        raise ValueError(f"drop path: expected one key or {batch} keys (one per sample), got "
                         f"keys of shape {shape}")
    keys = key if shape else jax.random.split(key, batch)
    return jax.vmap(lambda k: sample_keep(k, rate))(keys)


def drop_path(x: Array, keep: Array, rate: float) -> Array:
    """timm's `drop_path` with a given mask: `x * (keep / (1 - rate))`, `keep` one value per
    entry of `x`'s first axis (per sample; a scalar for one sample)."""
    scale = keep.astype(x.dtype) / (1.0 - rate)
    return x * scale.reshape(scale.shape + (1,) * (x.ndim - scale.ndim))


def block_keys(key: PRNGKeyArray, index: int) -> PRNGKeyArray:
    """The key of the `index`-th drop-path layer of a model from the model's key (of one
    sample, or `(N,)` keys of a batch): `fold_in(key, index)` per sample. A batched model
    passes `block_keys(split(key, N), index)` so that it draws what the Equinox model draws
    from each sample's key."""
    if _keys_shape(key) == ():
        return jax.random.fold_in(key, index)
    return jax.vmap(lambda k: jax.random.fold_in(k, index))(key)


def _check_rate(rate: float) -> None:
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"drop path rate must be in [0, 1), found {rate}")


class EqxDropPath(eqx.Module):
    """Equinox drop path of one sample (call it under `vmap` with one key per sample).

    **Arguments:** `rate`, the drop probability; `inference`: the identity (set by
    `eqx.nn.inference_mode`). A training call with `rate > 0` needs `key`."""

    rate: float = eqx.field(static=True)
    inference: bool

    def __init__(self, rate: float = 0.0, inference: bool = False) -> None:
        _check_rate(rate)
        self.rate = rate
        self.inference = inference

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None,
                 inference: bool | None = None) -> Array:
        inference = self.inference if inference is None else inference
        if inference or self.rate == 0.0:
            return x
        if key is None:
            raise RuntimeError("EqxDropPath needs a key in training (rate > 0); pass key=, or "
                               "run it with inference=True")
        return drop_path(x, sample_keep(key, self.rate), self.rate)


class LinenDropPath(nn.Module):
    """Flax Linen drop path of a batch (axis 0): the identity when `deterministic`; otherwise
    the mask is drawn from `key` (one key, or one per sample) or from the `rng_collection`
    stream ("dropout", as `nn.Dropout`)."""

    rate: float = 0.0
    deterministic: bool | None = None
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(self, x: Array, deterministic: bool | None = None, *,
                 key: PRNGKeyArray | None = None) -> Array:
        _check_rate(self.rate)
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if deterministic or self.rate == 0.0:
            return x
        if key is None:
            key = self.make_rng(self.rng_collection)
        return drop_path(x, keep_mask(key, x.shape[0], self.rate), self.rate)


class NNXDropPath(nnx.Module):
    """Flax NNX drop path of a batch (axis 0), as `nnx.Dropout`: `deterministic` (set by
    `model.eval()` / `model.train()`, or given at call time) makes it the identity; otherwise
    the mask is drawn from `rngs` given at call time (a key, one key per sample, an `nnx.Rngs`
    or `RngStream`) or given at construction."""

    def __init__(self, rate: float = 0.0, *, deterministic: bool = False,
                 rng_collection: str = "dropout",
                 rngs: nnx.Rngs | nnx.RngStream | None = None) -> None:
        _check_rate(rate)
        self.rate = rate
        self.deterministic = deterministic
        self.rng_collection = rng_collection
        if isinstance(rngs, nnx.Rngs):
            self.rngs = rngs[rng_collection].fork()
        elif isinstance(rngs, nnx.RngStream):
            self.rngs = rngs.fork()
        else:
            self.rngs = nnx.data(None)

    def __call__(self, x: Array, *, deterministic: bool | None = None,
                 rngs: Any = None) -> Array:
        deterministic = self.deterministic if deterministic is None else deterministic
        if deterministic or self.rate == 0.0:
            return x
        rngs = self.rngs if rngs is None else rngs
        if isinstance(rngs, nnx.Rngs):
            key = rngs[self.rng_collection]()
        elif isinstance(rngs, nnx.RngStream):
            key = rngs()
        elif isinstance(rngs, jax.Array):
            key = rngs
        else:
            raise RuntimeError("NNXDropPath needs rngs in training (rate > 0): a key, an "
                               "nnx.Rngs or an RngStream, at call time or construction")
        return drop_path(x, keep_mask(key, x.shape[0], self.rate), self.rate)

    def set_view(self, deterministic: bool | None = None) -> None:
        """For `nnx.view`: `deterministic=True` makes it the identity."""
        if deterministic is not None:
            self.deterministic = deterministic
