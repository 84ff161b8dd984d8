"""Drop path (stochastic depth), timm's `drop_path` in the three JAX libraries.

In training, a residual branch is dropped for whole samples: each sample is kept with
probability `keep = 1 - rate`, and a kept branch is scaled by `1 / keep` (timm's
`scale_by_keep=True`): `x * (mask / keep)` with one Bernoulli draw per sample. In evaluation
(and at `rate == 0`) it is the identity. This module holds the arithmetic shared by the
layers, each in its library's module (imported with that library only):
`zoo.layers.eqx.EqxDropPath` (per sample), `zoo.layers.linen.LinenDropPath`,
`zoo.layers.nnx.NNXDropPath` (batched) and `zoo.layers.torch.DropPath`.

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

import jax
from jaxtyping import Array, PRNGKeyArray

__all__ = ["block_keys", "check_rate", "drop_path", "keep_mask", "sample_keep"]


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


def check_rate(rate: float) -> None:
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"drop path rate must be in [0, 1), found {rate}")
