"""Flax NNX layers: conv-transpose with a method switch (same parameters as
`nnx.ConvTranspose`); multi-head attention whose q/k/v projections may go without a bias;
ConvNeXt V2's GlobalResponseNorm; for language models, transformers' RMSNorm, GPT-2's
`Conv1D` (a Linear under the layout of its kind) and the `nnx.Cache` variables of a KV cache on
the attention modules (`init_kv_cache`, `cached_kv`, as `nnx.MultiHeadAttention.init_cache`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax import Array

import canonical
from zoo.layers.causal import write_cache
from zoo.layers.conv_transpose import CHOICES
from zoo.layers.drop_path import check_rate, drop_path, keep_mask
from zoo.layers.flax_common import check_layer_norm, check_rms_norm, flax_conv_transpose, layer_norm
from zoo.layers.norm import global_response_norm, offset_rms_norm, rms_norm


class ConvTranspose(nnx.ConvTranspose):
    """`flax.nnx.ConvTranspose` with a `method` switch between exactly-equal formulations.

    Parameters (`kernel` `(*k, in, out)` in correlation form, `bias`) and the explicit `padding`
    pairs are those of `nnx.ConvTranspose` with `transpose_kernel=False`.
    """

    def __init__(self, *args, method: str = "auto", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if method not in CHOICES:
            raise ValueError(f"unknown conv-transpose method {method!r}; use one of "
                             f"{CHOICES}")
        self.method = method

    def __call__(self, inputs: Array) -> Array:
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, bias = self.promote_dtype(
            (inputs, self.kernel[...], bias), dtype=self.dtype
        )
        return flax_conv_transpose(self, inputs, kernel, bias)


class LayerNorm(nnx.LayerNorm):
    """`flax.nnx.LayerNorm` (parameters `scale`, `bias`) whose normalisation has its gradient
    in closed form (`zoo.layers.norm.normalize`). Over the last axis, with the two-pass variance
    (`use_fast_variance=False`, the default here)."""

    def __init__(self, *args, use_fast_variance: bool = False, **kwargs) -> None:
        super().__init__(*args, use_fast_variance=use_fast_variance, **kwargs)

    def __call__(self, x: Array, *, mask: Array | None = None) -> Array:
        check_layer_norm(self, mask)
        scale = self.scale[...] if self.scale is not None else None
        bias = self.bias[...] if self.bias is not None else None
        return layer_norm(x, scale, bias, self.epsilon, self.dtype)


class MultiHeadAttention(nnx.MultiHeadAttention):
    """`flax.nnx.MultiHeadAttention` with `qkv_bias=False` dropping the query, key and value
    biases while `out` keeps its own (timm's `qkv_bias`; Flax's `use_bias` drops both)."""

    def __init__(self, *args, qkv_bias: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not qkv_bias:
            for proj in (self.query, self.key, self.value):
                proj.use_bias, proj.bias = False, nnx.data(None)


class GlobalResponseNorm(nnx.Module):
    """ConvNeXt V2's GRN over a channels-last map `(N, *spatial, C)` (timm's
    `GlobalResponseNorm`): `scale` and `bias` `(C,)`, zeros at first (the identity)."""

    def __init__(self, num_features: int, *, epsilon: float = 1e-6,
                 param_dtype: Any = "float32", rngs: nnx.Rngs | None = None) -> None:
        del rngs  # zeros: nothing random
        self.scale = nnx.Param(jnp.zeros((num_features,), param_dtype))
        self.bias = nnx.Param(jnp.zeros((num_features,), param_dtype))
        self.epsilon = epsilon

    def __call__(self, x: Array) -> Array:
        return global_response_norm(x, self.scale[...], self.bias[...], self.epsilon, -1)


canonical.register_class("global_response_norm", "nnx", GlobalResponseNorm)


class RMSNorm(nnx.RMSNorm):
    """`flax.nnx.RMSNorm` (parameter `scale`) computing transformers' RMSNorm
    (`zoo.layers.norm.rms_norm`): statistics in float32, the normalised input cast back to its
    dtype before the scale. Over the last axis."""

    def __call__(self, x: Array, mask: Array | None = None) -> Array:
        check_rms_norm(self, mask)
        return rms_norm(x, self.epsilon, self.scale[...] if self.scale is not None else None)


class OffsetRMSNorm(nnx.Module):
    """transformers' `GemmaRMSNorm` (layer kind `offset_rms_norm`, parameter `scale`, zeros at
    first): over the last axis, the normalised input times `1 + scale`, in float32, cast
    back (`zoo.layers.norm.offset_rms_norm`)."""

    def __init__(self, num_features: int, *, epsilon: float = 1e-6, param_dtype: Any = None,
                 rngs: nnx.Rngs | None = None) -> None:
        self.scale = nnx.Param(jnp.zeros((num_features,), param_dtype or jnp.float32))
        self.epsilon = epsilon

    def __call__(self, x: Array) -> Array:
        return offset_rms_norm(x, self.epsilon, self.scale[...])


canonical.register_class("offset_rms_norm", "nnx", OffsetRMSNorm)


class Conv1D(nnx.Linear):
    """transformers' `Conv1D` (GPT-2's projections): a Linear, whose `(in, out)` kernel is
    transformers' weight as it is (layer kind `hf_conv1d`)."""


canonical.register_class("hf_conv1d", "nnx", Conv1D)


class NNXDropPath(nnx.Module):
    """Flax NNX drop path of a batch (axis 0), as `nnx.Dropout`: `deterministic` (set by
    `model.eval()` / `model.train()`, or given at call time) makes it the identity; otherwise
    the mask is drawn from `rngs` given at call time (a key, one key per sample, an `nnx.Rngs`
    or `RngStream`) or given at construction."""

    def __init__(self, rate: float = 0.0, *, deterministic: bool = False,
                 rng_collection: str = "dropout",
                 rngs: nnx.Rngs | nnx.RngStream | None = None) -> None:
        check_rate(rate)
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


def init_kv_cache(module: nnx.Module, batch: int, max_length: int, kv_heads: int,
                  head_dim: int, dtype: Any) -> None:
    """Give the attention `module` its cache, `nnx.Cache` variables `cached_key` and
    `cached_value` `(batch, max_length, kv_heads, head_dim)` (zeros), as
    `nnx.MultiHeadAttention.init_cache` does; from then on its calls decode."""
    shape = (batch, max_length, kv_heads, head_dim)
    module.cached_key = nnx.Cache(jnp.zeros(shape, dtype))
    module.cached_value = nnx.Cache(jnp.zeros(shape, dtype))


def cached_kv(module: nnx.Module, k: Array, v: Array, index: Array | int
              ) -> tuple[Array, Array]:
    """`k`, `v` as they are when `module` has no cache; else written into its cache at slot
    `index`, every slot returned."""
    if module.cached_key is None:
        return k, v
    module.cached_key[...] = write_cache(module.cached_key[...], k, index, 1)
    module.cached_value[...] = write_cache(module.cached_value[...], v, index, 1)
    return module.cached_key[...], module.cached_value[...]
