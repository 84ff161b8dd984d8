"""Flax Linen layers: conv-transpose with a method switch (same parameters as
`nn.ConvTranspose`); self-attention whose q/k/v projections may go without a bias; ConvNeXt
V2's GlobalResponseNorm; for language models, transformers' RMSNorm, GPT-2's `Conv1D` (a
Dense under the layout of its kind) and the "cache" collection of `decode=True` (`cached_kv`,
`cache_index`, as Flax's own attention keeps it)."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import canonical
from zoo.layers.causal import write_cache
from zoo.layers.drop_path import check_rate, drop_path, keep_mask
from zoo.layers.flax_common import check_layer_norm, check_rms_norm, flax_conv_transpose, layer_norm
from zoo.layers.norm import global_response_norm, offset_rms_norm, rms_norm


class ConvTranspose(nn.ConvTranspose):
    """`flax.linen.ConvTranspose` with a `method` switch between exactly-equal formulations.

    Parameters (`kernel` of shape `(*k, in, out)` in correlation form, `bias`), names and the
    explicit `padding` pairs are those of `nn.ConvTranspose` with `transpose_kernel=False`.
    Pass `kernel_size` as a tuple and `padding` as explicit pairs (see
    `zoo.layers.conv_transpose.torch_padding`).
    """

    method: str = "auto"

    @nn.compact
    def __call__(self, inputs: Array) -> Array:
        if not isinstance(self.kernel_size, tuple):
            raise ValueError(f"kernel_size must be a tuple, got {self.kernel_size!r}")
        kernel = self.param("kernel", self.kernel_init,
                            (*self.kernel_size, inputs.shape[-1], self.features), self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        return flax_conv_transpose(self, inputs, kernel, bias)


class LayerNorm(nn.LayerNorm):
    """`flax.linen.LayerNorm` (parameters `scale`, `bias`) whose normalisation has its gradient
    in closed form (`zoo.layers.norm.normalize`). Over the last axis, with the two-pass variance
    (`use_fast_variance=False`, the default here)."""

    use_fast_variance: bool = False

    @nn.compact
    def __call__(self, x: Array, *, mask: Array | None = None) -> Array:
        check_layer_norm(self, mask)
        shape = (x.shape[-1],)
        scale = (self.param("scale", self.scale_init, shape, self.param_dtype)
                 if self.use_scale else None)
        bias = (self.param("bias", self.bias_init, shape, self.param_dtype)
                if self.use_bias else None)
        return layer_norm(x, scale, bias, self.epsilon, self.dtype)


class SelfAttention(nn.MultiHeadDotProductAttention):
    """`flax.linen.MultiHeadDotProductAttention`'s parameters (`query`/`key`/`value` kernels
    `(E, heads, D)`, `out` `(heads, D, E)`) with `qkv_bias=False` dropping the query, key and
    value biases while `out` keeps its own (timm's `qkv_bias`; Flax's `use_bias` drops both).
    Self-attention only: no mask, dropout, cache or query-key normalisation."""

    qkv_bias: bool = True

    @nn.compact
    def __call__(self, inputs_q: Array, *args: object, **kwargs: object) -> Array:
        if args or kwargs or self.normalize_qk or self.decode or self.dropout_rate:
            raise ValueError("SelfAttention: masks, a second input, dropout, a cache and "
                             "normalize_qk are not supported")
        features = self.qkv_features or inputs_q.shape[-1]
        dense = functools.partial(
            nn.DenseGeneral, features=(self.num_heads, features // self.num_heads),
            use_bias=self.use_bias and self.qkv_bias, kernel_init=self.kernel_init,
            bias_init=self.bias_init, dtype=self.dtype, param_dtype=self.param_dtype,
            precision=self.precision)
        q, k, v = (dense(name=name)(inputs_q) for name in ("query", "key", "value"))
        y = self.attention_fn(q, k, v, dtype=self.dtype, precision=self.precision)
        return nn.DenseGeneral(
            self.out_features or inputs_q.shape[-1], axis=(-2, -1), use_bias=self.use_bias,
            kernel_init=self.out_kernel_init or self.kernel_init,
            bias_init=self.out_bias_init or self.bias_init, dtype=self.dtype,
            param_dtype=self.param_dtype, precision=self.precision, name="out")(y)


class GlobalResponseNorm(nn.Module):
    """ConvNeXt V2's GRN over a channels-last map `(N, *spatial, C)` (timm's
    `GlobalResponseNorm`): parameters `scale` and `bias` `(C,)`, zeros at first (the
    identity)."""

    epsilon: float = 1e-6
    param_dtype: Any = "float32"

    @nn.compact
    def __call__(self, x: Array) -> Array:
        shape = (x.shape[-1],)
        scale = self.param("scale", nn.initializers.zeros, shape, self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, shape, self.param_dtype)
        return global_response_norm(x, scale, bias, self.epsilon, -1)


canonical.register_class("global_response_norm", "linen", GlobalResponseNorm)


class RMSNorm(nn.RMSNorm):
    """`flax.linen.RMSNorm` (parameter `scale`) computing transformers' RMSNorm
    (`zoo.layers.norm.rms_norm`): statistics in float32, the normalised input cast back to its
    dtype before the scale. Over the last axis."""

    @nn.compact
    def __call__(self, x: Array, *, mask: Array | None = None) -> Array:
        check_rms_norm(self, mask)
        scale = (self.param("scale", self.scale_init, (x.shape[-1],), self.param_dtype)
                 if self.use_scale else None)
        return rms_norm(x, self.epsilon, scale)


class OffsetRMSNorm(nn.Module):
    """transformers' `GemmaRMSNorm` (layer kind `offset_rms_norm`, parameter `scale`, zeros at
    first): over the last axis, the normalised input times `1 + scale`, in float32, cast
    back (`zoo.layers.norm.offset_rms_norm`)."""

    epsilon: float = 1e-6
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = self.param("scale", nn.initializers.zeros, (x.shape[-1],), self.param_dtype)
        return offset_rms_norm(x, self.epsilon, scale)


canonical.register_class("offset_rms_norm", "linen", OffsetRMSNorm)


class Conv1D(nn.Dense):
    """transformers' `Conv1D` (GPT-2's projections): a Dense, whose `(in, out)` kernel is
    transformers' weight as it is (layer kind `hf_conv1d`)."""


canonical.register_class("hf_conv1d", "linen", Conv1D)


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
        check_rate(self.rate)
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if deterministic or self.rate == 0.0:
            return x
        if key is None:
            key = self.make_rng(self.rng_collection)
        return drop_path(x, keep_mask(key, x.shape[0], self.rate), self.rate)


def cached_kv(module: nn.Module, k: Array, v: Array, index: Array | int
              ) -> tuple[Array, Array]:
    """Flax's decode idiom, from inside `module`'s compact call: `module.init` with
    `decode=True` and a full-length input creates the "cache" collection's `cached_key` and
    `cached_value` `(N, max_length, kv_heads, head_dim)` (and returns `k`, `v`); a later call
    writes `k`, `v` at slot `index` and returns every slot."""
    initialized = module.has_variable("cache", "cached_key")
    keys = module.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    values = module.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    if not initialized:
        return k, v
    keys.value = write_cache(keys.value, k, index, 1)
    values.value = write_cache(values.value, v, index, 1)
    return keys.value, values.value


def cache_index(module: nn.Module, length: int) -> Array | int:
    """The slot of a decode call's first token (the "cache" collection's `index`, advanced by
    the call's `length`); 0 at init."""
    initialized = module.has_variable("cache", "index")
    index = module.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    start = index.value
    if initialized:
        index.value = start + length
    return start
