"""Equinox layers of the zoo: a Flax-semantics BatchNorm, a convolution that runs 3-D ones as
im2col + GEMM on the CPU, a conv-transpose with methods, a max pool with a fast exact gradient,
a Linear (and the MultiheadAttention built on it) that keeps `vmap`'s batch dimensions leading,
timm's LayerNorm2d and GlobalResponseNorm (ConvNeXt), and for language models transformers'
RMSNorm, GPT-2's `Conv1D` (a Linear under the layout of its kind) and the KV cache a
sequence's decoding threads through the model's call (`KVCache`)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

import canonical
from zoo.layers.batch_norm import BatchNorm
from zoo.layers.conv import conv_general_dilated
from zoo.layers.conv_transpose import CHOICES, conv_transpose
from zoo.layers.dense import contract
from zoo.layers.drop_path import check_rate, drop_path, sample_keep
from zoo.layers.norm import global_response_norm, layer_norm, offset_rms_norm, rms_norm
from zoo.layers.pooling import max_pool_axes

__all__ = ["BatchNorm", "Conv", "Conv1D", "Conv3d", "ConvTranspose", "GlobalResponseNorm",
           "KVCache", "LayerNorm", "LayerNorm2d", "Linear", "MaxPool3d", "MultiheadAttention",
           "OffsetRMSNorm", "RMSNorm"]

_NO_STATE = object()  # LayerNorm called without a state returns no state


class Conv(eqx.nn.Conv):
    """`eqx.nn.Conv` through `zoo.layers.conv.conv_general_dilated`: 3-D (and higher)
    stride-1 convolutions as im2col + GEMM on the CPU, the rest as XLA's convolution. Same
    fields, arguments and parameter layout as `eqx.nn.Conv` (converters treat both alike)."""

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply to one sample `x` of shape `(in_channels, *spatial)`."""
        del key
        if x.ndim != self.num_spatial_dims + 1:
            raise ValueError(f"Conv expects rank {self.num_spatial_dims + 1} input, got shape "
                             f"{x.shape}")
        padding = self.padding
        if self.padding_mode != "ZEROS":
            x, padding = self._nonzero_pad(x), "VALID"
        y = conv_general_dilated(x[None], self.weight, self.stride, padding,
                                 rhs_dilation=self.dilation,
                                 feature_group_count=self.groups)[0]
        return y + jnp.asarray(self.bias) if self.use_bias else y


class Conv3d(Conv):
    """`Conv` with three spatial dimensions (as `eqx.nn.Conv3d`)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any,
                 stride: Any = (1, 1, 1), padding: Any = (0, 0, 0), dilation: Any = (1, 1, 1),
                 groups: int = 1, use_bias: bool = True, padding_mode: str = "ZEROS",
                 dtype: Any = None, *, key: PRNGKeyArray) -> None:
        super().__init__(3, in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, use_bias, padding_mode, dtype, key=key)


class ConvTranspose(eqx.nn.ConvTranspose):
    """`eqx.nn.ConvTranspose` with a choice of exactly-equal formulations (`method`).

    Same fields, parameter layout and PyTorch-style arguments as `eqx.nn.ConvTranspose`, so
    checkpoints and converters treat both alike. `method` is one of `zoo.layers.METHODS` or
    "auto" (see `zoo.layers.conv_transpose.choose_method`). Zero padding and groups=1 only.
    """

    method: str = eqx.field(static=True)

    def __init__(self, *args, method: str = "auto", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if method not in CHOICES:
            raise ValueError(f"unknown conv-transpose method {method!r}; use one of "
                             f"{CHOICES}")
        if self.groups != 1 or self.padding_mode != "ZEROS" or isinstance(self.padding, str):
            raise ValueError("zoo ConvTranspose supports groups=1, zero, explicit padding only")
        if any(lo != hi for lo, hi in self.padding):
            raise ValueError(f"zoo ConvTranspose needs symmetric padding, got {self.padding}")
        self.method = method

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply to one sample `x` of shape `(in_channels, *spatial)`."""
        del key
        n = self.num_spatial_dims
        if x.ndim != n + 1:
            raise ValueError(f"ConvTranspose expects rank {n + 1} input, got shape {x.shape}")
        sp = "DHW"[-n:] if n <= 3 else "".join(chr(ord("a") + i) for i in range(n))
        y = conv_transpose(
            x[None], self.weight, stride=self.stride,
            padding=tuple(lo for lo, _ in self.padding), output_padding=self.output_padding,
            dilation=self.dilation, dimension_numbers=("NC" + sp, "OI" + sp, "NC" + sp),
            method=self.method,
        )[0]
        if self.use_bias:
            y = y + jnp.asarray(self.bias)
        return y


class MaxPool3d(eqx.nn.MaxPool3d):
    """`eqx.nn.MaxPool3d` through `zoo.layers.pooling`: non-overlapping windows as a reshape
    and a max, with the same values and gradient (ties included) and a fast backward on XLA:CPU.
    Same fields and arguments."""

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply to one sample `x` of shape `(channels, *spatial)`."""
        if self.use_ceil:
            return super().__call__(x, key=key)
        if x.ndim != self.num_spatial_dims + 1:
            raise ValueError(f"MaxPool3d expects rank {self.num_spatial_dims + 1} input, got "
                             f"shape {x.shape}")
        return max_pool_axes(x, self.kernel_size, self.stride, self.padding, range(1, x.ndim))


class Linear(eqx.nn.Linear):
    """`eqx.nn.Linear` contracting `x`'s features with the weight's axis 1 where it lies
    (`zoo.layers.dense.contract`) instead of `weight @ x + bias`.

    The same function, fields and parameter layout (converters and checkpoints treat both
    alike). Under `vmap` (tokens, batch) `weight @ x` puts the batch dimensions after the
    features, `(out, tokens, batch)`, and XLA:CPU transposes every such output and its
    cotangent back to the row-major layout of the ops around it; `x @ weight.T` keeps them
    leading but XLA:CPU materialises `weight.T`, a copy of the whole weight at every call (a
    decode step's largest cost). `contract` keeps the batch leading and copies nothing
    (docs/investigations/cpu_training_step.md, "Equinox's layout transposes";
    docs/language_models.md, the decode record).
    """

    @classmethod
    def of(cls, linear: eqx.nn.Linear) -> Linear:
        """This layer with the arrays and fields of `linear` (nothing copied)."""
        new = object.__new__(cls)
        for field in dataclasses.fields(linear):
            object.__setattr__(new, field.name, getattr(linear, field.name))
        return new

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply to one input of shape `(in_features,)` (or `()` for "scalar")."""
        if "scalar" in (self.in_features, self.out_features):
            return super().__call__(x, key=key)
        y = contract(x, self.weight)
        return y if self.bias is None else y + self.bias


class LayerNorm(eqx.nn.LayerNorm):
    """`eqx.nn.LayerNorm` whose normalisation has its gradient in closed form
    (`zoo.layers.norm.layer_norm`): the same function, fields and layer kind."""

    def __call__(self, x: Array, state: Any = _NO_STATE, *, key: PRNGKeyArray | None = None
                 ) -> Any:
        if x.shape != self.shape:
            raise ValueError(f"LayerNorm(shape={self.shape}) got an input of shape {x.shape}; "
                             "vmap it over the leading axes")
        out = layer_norm(x, len(self.shape), self.eps, self.weight if self.use_weight else None,
                         self.bias if self.use_bias else None, x.dtype)
        return out if state is _NO_STATE else (out, state)


class LayerNorm2d(eqx.Module):
    """timm's `LayerNorm2d`: a LayerNorm over the channels of one channels-first map `(C,
    *spatial)` (`weight`, `bias` of shape `(C,)`; the layer kind `layer_norm`, as PyTorch's
    LayerNorm and Flax's over a channels-last map). timm's eps, 1e-6, by default."""

    weight: Array
    bias: Array
    eps: float = eqx.field(static=True)

    def __init__(self, channels: int, eps: float = 1e-6, dtype: Any = None) -> None:
        dtype = jnp.float32 if dtype is None else dtype
        self.weight = jnp.ones((channels,), dtype)
        self.bias = jnp.zeros((channels,), dtype)
        self.eps = eps

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        if x.shape[0] != self.weight.shape[0]:
            raise ValueError(f"LayerNorm2d expects {self.weight.shape[0]} channels on axis 0, "
                             f"got shape {x.shape}")
        y = layer_norm(jnp.moveaxis(x, 0, -1), 1, self.eps, self.weight, self.bias, x.dtype)
        return jnp.moveaxis(y, -1, 0)


class GlobalResponseNorm(eqx.Module):
    """ConvNeXt V2's GRN of one sample (timm's `GlobalResponseNorm`, `weight` and `bias` of the
    channels, zeros at first: the identity): channels first `(C, *spatial)`, or last with
    `channels_last` (timm's channels-last MLP)."""

    weight: Array
    bias: Array
    eps: float = eqx.field(static=True)
    channels_last: bool = eqx.field(static=True)

    def __init__(self, channels: int, eps: float = 1e-6, channels_last: bool = False,
                 dtype: Any = None) -> None:
        dtype = jnp.float32 if dtype is None else dtype
        self.weight = jnp.zeros((channels,), dtype)
        self.bias = jnp.zeros((channels,), dtype)
        self.eps = eps
        self.channels_last = channels_last

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        axis = -1 if self.channels_last else 1  # of the batch of one it computes
        return global_response_norm(x[None], self.weight, self.bias, self.eps, axis)[0]


canonical.register_class("layer_norm", "eqx", LayerNorm2d)
canonical.register_class("global_response_norm", "eqx", GlobalResponseNorm)


class RMSNorm(eqx.nn.RMSNorm):
    """`eqx.nn.RMSNorm` (same fields and layer kind) computing transformers' RMSNorm
    (`zoo.layers.norm.rms_norm`): statistics in float32, the normalised input cast back to its
    dtype before the weight. Over a vector: vmap it over the leading axes."""

    def __call__(self, x: Array, state: Any = _NO_STATE, *, key: PRNGKeyArray | None = None
                 ) -> Any:
        if x.shape != self.shape or len(self.shape) != 1:
            raise ValueError(f"RMSNorm(shape={self.shape}) got an input of shape {x.shape}; "
                             "vmap it over the leading axes")
        out = rms_norm(x, self.eps, self.weight if self.use_weight else None)
        out = out if not self.use_bias else out + self.bias
        return out if state is _NO_STATE else (out, state)


class OffsetRMSNorm(eqx.Module):
    """transformers' `GemmaRMSNorm` (layer kind `offset_rms_norm`,
    `zoo.layers.norm.offset_rms_norm`): the normalised vector times `1 + weight`, in float32,
    cast back; `weight` starts at zero. Over a vector: vmap it over the leading axes."""

    weight: Array
    eps: float = eqx.field(static=True)

    def __init__(self, size: int, eps: float = 1e-6, dtype: Any = None) -> None:
        self.weight = jnp.zeros((size,), dtype or jnp.float32)
        self.eps = eps

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        if x.shape != self.weight.shape:
            raise ValueError(f"OffsetRMSNorm({self.weight.shape[0]}) got an input of shape "
                             f"{x.shape}; vmap it over the leading axes")
        return offset_rms_norm(x, self.eps, self.weight)


canonical.register_class("offset_rms_norm", "eqx", OffsetRMSNorm)


class Conv1D(Linear):
    """transformers' `Conv1D` (GPT-2's projections) as an Equinox Linear: the same function
    and fields, `weight` held `(out, in)` as `eqx.nn.Linear` holds it. Its layer kind
    (`hf_conv1d`) maps it to the canonical `(in, out)` weight of transformers' files."""


canonical.register_class("hf_conv1d", "eqx", Conv1D)


class KVCache(eqx.Module):
    """One sequence's keys and values in every attention layer, preallocated `(max_length,
    kv_heads, head_dim)`, and `index`, the slot the next call writes its first token to.
    An explicit pytree, passed to the model's call and returned updated (`model(ids, ...,
    cache=cache) -> (logits, cache)`): never part of the model, so neither its weights nor
    its `eqx.nn.State`. Batched: `jax.vmap` over a cache of stacked sequences."""

    keys: tuple[Array, ...]
    values: tuple[Array, ...]
    index: Array

    @classmethod
    def empty(cls, layers: int, max_length: int, kv_heads: int, head_dim: int,
              dtype: Any) -> KVCache:
        zeros = lambda: jnp.zeros((max_length, kv_heads, head_dim), dtype)
        return cls(tuple(zeros() for _ in range(layers)),
                   tuple(zeros() for _ in range(layers)), jnp.zeros((), jnp.int32))

    @property
    def max_length(self) -> int:
        return self.keys[0].shape[-3]

    def layer(self, i: int) -> tuple[Array, Array]:
        return self.keys[i], self.values[i]

    def updated(self, layers: list[tuple[Array, Array]], length: int) -> KVCache:
        """The cache holding the layers' new `(keys, values)`, its index `length` further."""
        keys, values = zip(*layers, strict=True)
        return KVCache(tuple(keys), tuple(values), self.index + length)


class MultiheadAttention(eqx.nn.MultiheadAttention):
    """`eqx.nn.MultiheadAttention` whose four projections are the zoo's `Linear` (same
    arguments, fields and parameters; see `Linear` for why)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("query_proj", "key_proj", "value_proj", "output_proj"):
            setattr(self, name, Linear.of(getattr(self, name)))


def with_new_head(model: Any, name: str, in_features: int, num_classes: int, *,
                  key: jax.Array) -> Any:
    """A copy of `model` whose Linear `name` is a fresh one for `num_classes` (None for 0, a
    model without a head, as timm's identity) and whose config says so (timm's
    `reset_classifier`, functionally); `model` is not changed. The config is a static field,
    which `eqx.tree_at` cannot replace."""
    dtype = next(a.dtype for a in jax.tree.leaves(model) if eqx.is_inexact_array(a))
    new = copy.copy(model)
    object.__setattr__(new, "config", dataclasses.replace(model.config, num_classes=num_classes))
    object.__setattr__(new, name, Linear(in_features, num_classes, key=key, dtype=dtype)
                       if num_classes else None)
    return new


class EqxDropPath(eqx.Module):
    """Equinox drop path of one sample (call it under `vmap` with one key per sample).

    **Arguments:** `rate`, the drop probability; `inference`: the identity (set by
    `eqx.nn.inference_mode`). A training call with `rate > 0` needs `key`."""

    rate: float = eqx.field(static=True)
    inference: bool

    def __init__(self, rate: float = 0.0, inference: bool = False) -> None:
        check_rate(rate)
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
