"""The decoder body in Flax NNX, batched `(N, L)`: the modules a `DecoderSpec` declares,
named as its `Names` say. A tied head is `embedding.attend` (no array of its own).
`init_cache` gives the model a KV cache of `nnx.Cache` variables, as Flax's attention does."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import canonical
from zoo.layers.causal import attend, default_positions, rotary, sequence_mask, softcap
from zoo.layers.dense import contract
from zoo.layers.moe import DISPATCHES, route
from zoo.layers.nnx import (
    Conv1D,
    LayerNorm,
    OffsetRMSNorm,
    RMSNorm,
    cached_kv,
    init_kv_cache,
)
from zoo.models.common import activation, dtype_of
from zoo.models.decoder.spec import POST_ROLES, DecoderSpec, MLPSpec, padded_positions

Rngs = nnx.Rngs | jax.Array | None
NORMS: dict[str, type[nnx.Module]] = {"layer_norm": LayerNorm, "rms_norm": RMSNorm,
                                      "offset_rms_norm": OffsetRMSNorm}


def make_norm(spec: DecoderSpec, size: int, dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.Module:
    return NORMS[spec.norm](size, epsilon=spec.norm_eps, param_dtype=dtype, rngs=rngs)


class Container(nnx.Module):
    """A plain node of transformers' nesting (the `attention` of `attention.self`)."""


def place(owner: nnx.Module, path: str, module: Any) -> None:
    """`module` set at the dotted `path` under `owner`, `Container`s created on the way."""
    *parents, name = path.split(".")
    for part in parents:
        if not hasattr(owner, part):
            setattr(owner, part, Container())
        owner = getattr(owner, part)
    setattr(owner, name, module)


def at(module: Any, path: str) -> Any:
    """The module at the dotted `path` under `module`."""
    return functools.reduce(getattr, path.split("."), module)


class SelfAttention(nnx.Module):
    """Causal self-attention (grouped key/value heads, rotary positions with the layer's
    inverse frequencies `inv_freq` when it has them, a sliding window through the mask, the
    spec's scale and soft-capping); a layout adds its projections and defines `project`
    (queries, keys, values `(N, L, heads, D)`) and `output`."""

    def __init__(self, spec: DecoderSpec) -> None:
        self.spec = spec
        self.dropout = nnx.Dropout(spec.attention.dropout)
        self.cached_key: nnx.Cache | None = nnx.data(None)  # init_kv_cache
        self.cached_value: nnx.Cache | None = nnx.data(None)

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 inv_freq: np.ndarray | None, rngs: Rngs = None, index: jax.Array | int = 0
                 ) -> jax.Array:
        a, (n, length, _) = self.spec.attention, x.shape
        q, k, v = self.project(x)
        if inv_freq is not None:
            q, k = rotary(q, positions, inv_freq), rotary(k, positions, inv_freq)
        k, v = cached_kv(self, k, v, index)
        out = attend(q, k, v, mask, a.scaling, lambda w: self.dropout(w, rngs=rngs),
                     a.logit_softcap)
        return self.output(out.reshape(n, length, -1))


class FusedAttention(SelfAttention):
    """GPT-2's `c_attn` (queries, keys and values in one `Conv1D`) and `c_proj`."""

    def __init__(self, spec: DecoderSpec, *, rngs: nnx.Rngs, param_dtype: Any) -> None:
        super().__init__(spec)
        e = spec.hidden_size
        self.c_attn = Conv1D(e, 3 * e, param_dtype=param_dtype, rngs=rngs)
        self.c_proj = Conv1D(e, e, param_dtype=param_dtype, rngs=rngs)

    def project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        n, length, _ = x.shape
        return tuple(t.reshape(n, length, self.spec.attention.heads, -1)
                     for t in jnp.split(self.c_attn(x), 3, axis=-1))

    def output(self, h: jax.Array) -> jax.Array:
        return self.c_proj(h)


class Attention(SelfAttention):
    """`q_proj`, `k_proj`, `v_proj`, `o_proj` and, with `qk_norm`, per-head `q_norm` and
    `k_norm` over `head_dim`."""

    def __init__(self, spec: DecoderSpec, *, rngs: nnx.Rngs, param_dtype: Any) -> None:
        super().__init__(spec)
        a, e, dt = spec.attention, spec.hidden_size, param_dtype
        q, kv, b = a.heads * a.head_dim, a.kv_heads * a.head_dim, a.qkv_bias
        self.q_proj = nnx.Linear(e, q, use_bias=b, param_dtype=dt, rngs=rngs)
        self.k_proj = nnx.Linear(e, kv, use_bias=b, param_dtype=dt, rngs=rngs)
        self.v_proj = nnx.Linear(e, kv, use_bias=b, param_dtype=dt, rngs=rngs)
        self.o_proj = nnx.Linear(q, e, use_bias=a.out_bias, param_dtype=dt, rngs=rngs)
        self.q_norm = make_norm(spec, a.head_dim, dt, rngs) if a.qk_norm else None
        self.k_norm = make_norm(spec, a.head_dim, dt, rngs) if a.qk_norm else None

    def project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        a, (n, length, _) = self.spec.attention, x.shape
        q = self.q_proj(x).reshape(n, length, a.heads, a.head_dim)
        k = self.k_proj(x).reshape(n, length, a.kv_heads, a.head_dim)
        v = self.v_proj(x).reshape(n, length, a.kv_heads, a.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def output(self, h: jax.Array) -> jax.Array:
        return self.o_proj(h)


class FusedQKVAttention(SelfAttention):
    """Phi-3's `qkv_proj` (queries, keys, values stacked along its output: `heads * head_dim`,
    then twice `kv_heads * head_dim`) and `o_proj` (defined first, as transformers does)."""

    def __init__(self, spec: DecoderSpec, *, rngs: nnx.Rngs, param_dtype: Any) -> None:
        super().__init__(spec)
        a, e, dt = spec.attention, spec.hidden_size, param_dtype
        self.o_proj = nnx.Linear(a.heads * a.head_dim, e, use_bias=a.out_bias, param_dtype=dt,
                                 rngs=rngs)
        self.qkv_proj = nnx.Linear(e, sum(a.qkv_sizes), use_bias=a.qkv_bias, param_dtype=dt,
                                   rngs=rngs)

    def project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        a, (n, length, _) = self.spec.attention, x.shape
        q, kv, _ = a.qkv_sizes
        return tuple(t.reshape(n, length, -1, a.head_dim)
                     for t in jnp.split(self.qkv_proj(x), (q, q + kv), axis=-1))

    def output(self, h: jax.Array) -> jax.Array:
        return self.o_proj(h)


class MLP(nnx.Module):
    """GPT-2's `c_proj(act(c_fc(x)))` (`Conv1D`s)."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, rngs: nnx.Rngs, param_dtype: Any
                 ) -> None:
        e, m = spec.hidden_size, mlp.width
        self.activation = mlp.activation
        self.c_fc = Conv1D(e, m, param_dtype=param_dtype, rngs=rngs)
        self.c_proj = Conv1D(m, e, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.c_proj(activation(self.activation)(self.c_fc(x)))


class GatedMLP(nnx.Module):
    """`down_proj(act(gate_proj(x)) * up_proj(x))` (SwiGLU with `silu`)."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, rngs: nnx.Rngs, param_dtype: Any
                 ) -> None:
        e, m, b, dt = spec.hidden_size, mlp.width, mlp.bias, param_dtype
        self.activation = mlp.activation
        self.gate_proj = nnx.Linear(e, m, use_bias=b, param_dtype=dt, rngs=rngs)
        self.up_proj = nnx.Linear(e, m, use_bias=b, param_dtype=dt, rngs=rngs)
        self.down_proj = nnx.Linear(m, e, use_bias=b, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        act = activation(self.activation)
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))


class GateUpMLP(nnx.Module):
    """Phi-3's `down_proj(act(gate) * up)`, gate and up from one `gate_up_proj` (gate first)."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, rngs: nnx.Rngs, param_dtype: Any
                 ) -> None:
        e, m, b, dt = spec.hidden_size, mlp.width, mlp.bias, param_dtype
        self.activation = mlp.activation
        self.gate_up_proj = nnx.Linear(e, 2 * m, use_bias=b, param_dtype=dt, rngs=rngs)
        self.down_proj = nnx.Linear(m, e, use_bias=b, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = jnp.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(up * activation(self.activation)(gate))


class Experts(nnx.Module):
    """A mixture's experts (layer kind `experts`): `gate_up_proj` `(E, hidden, 2 * width)` and
    `down_proj` `(E, width, hidden)`, transformers' fused weights as kernels, over tokens
    `(T, hidden)` and their routing, computed by `dispatch` (`zoo.layers.moe`)."""

    def __init__(self, experts: int, hidden: int, width: int, activation: str, *,
                 dispatch: str = "sorted", param_dtype: Any = None, rngs: nnx.Rngs) -> None:
        init = nnx.initializers.lecun_normal(in_axis=1, out_axis=2, batch_axis=(0,))
        dt = param_dtype or jnp.float32
        self.gate_up_proj = nnx.Param(init(rngs.params(), (experts, hidden, 2 * width), dt))
        self.down_proj = nnx.Param(init(rngs.params(), (experts, width, hidden), dt))
        self.activation, self.dispatch = activation, dispatch

    def __call__(self, x: jax.Array, weights: jax.Array, experts: jax.Array) -> jax.Array:
        gate_up, down = self.gate_up_proj[...], self.down_proj[...]
        dtype = jnp.result_type(x, gate_up)
        return DISPATCHES[self.dispatch](x.astype(dtype), weights, experts,
                                         gate_up.astype(dtype), down.astype(dtype),
                                         activation(self.activation))


canonical.register_class("experts", "nnx", Experts)


class SparseMoE(nnx.Module):
    """A mixture of experts (transformers' sparse MoE block): the router `gate` (a Linear
    without bias, one logit per expert), softmax, top-k routing, the `experts` (defined in
    transformers' order, `MoESpec.router_first`)."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, rngs: nnx.Rngs, param_dtype: Any
                 ) -> None:
        e, m, dt = spec.hidden_size, mlp.moe, param_dtype
        make = {"gate": lambda: nnx.Linear(e, m.experts, use_bias=False, param_dtype=dt,
                                           rngs=rngs),
                "experts": lambda: Experts(m.experts, e, mlp.width, mlp.activation,
                                           dispatch=m.dispatch, param_dtype=dt, rngs=rngs)}
        for name in ("gate", "experts") if m.router_first else ("experts", "gate"):
            setattr(self, name, make[name]())
        self.top_k, self.normalize = m.top_k, m.normalize

    def router_logits(self, x: jax.Array) -> jax.Array:
        """The router's logits `(N, L, experts)`."""
        return self.gate(x)

    def __call__(self, x: jax.Array) -> jax.Array:
        flat = x.reshape(-1, x.shape[-1])
        weights, experts = route(self.gate(flat), self.top_k, self.normalize)
        return self.experts(flat, weights, experts).reshape(x.shape)


class QueryKeyValue(SelfAttention):
    """BERT's `query`, `key`, `value` (its output projection: the block's `attention_output`,
    `ResidualOutput`)."""

    def __init__(self, spec: DecoderSpec, *, rngs: nnx.Rngs, param_dtype: Any) -> None:
        super().__init__(spec)
        a, e, dt = spec.attention, spec.hidden_size, param_dtype
        q, b = a.heads * a.head_dim, a.qkv_bias
        self.query = nnx.Linear(e, q, use_bias=b, param_dtype=dt, rngs=rngs)
        self.key = nnx.Linear(e, q, use_bias=b, param_dtype=dt, rngs=rngs)
        self.value = nnx.Linear(e, q, use_bias=b, param_dtype=dt, rngs=rngs)

    def project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        a, (n, length, _) = self.spec.attention, x.shape
        return tuple(p(x).reshape(n, length, a.heads, a.head_dim)
                     for p in (self.query, self.key, self.value))

    def output(self, h: jax.Array) -> jax.Array:
        return h


class DenseMLP(nnx.Module):
    """BERT's intermediate, `act(dense(x))` (its second matrix: the block's `mlp_output`)."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, rngs: nnx.Rngs, param_dtype: Any
                 ) -> None:
        self.activation = mlp.activation
        self.dense = nnx.Linear(spec.hidden_size, mlp.width, use_bias=mlp.bias,
                                param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return activation(self.activation)(self.dense(x))


class ResidualOutput(nnx.Module):
    """A post-norm branch's end, `LayerNorm(dropout(dense(h)) + x)` (BERT's `BertSelfOutput`,
    `BertOutput`)."""

    def __init__(self, spec: DecoderSpec, width: int, *, rngs: nnx.Rngs, param_dtype: Any
                 ) -> None:
        e = spec.hidden_size
        self.dense = nnx.Linear(width, e, param_dtype=param_dtype, rngs=rngs)
        self.LayerNorm = make_norm(spec, e, param_dtype, rngs)
        self.dropout = nnx.Dropout(spec.residual_dropout)

    def __call__(self, h: jax.Array, x: jax.Array, rngs: Rngs = None) -> jax.Array:
        return self.LayerNorm(self.dropout(self.dense(h), rngs=rngs) + x)


class OutProjAttention(SelfAttention):
    """CLIP's and SigLIP's `k_proj`, `v_proj`, `q_proj`, `out_proj` (transformers' order)."""

    def __init__(self, spec: DecoderSpec, *, rngs: nnx.Rngs, param_dtype: Any) -> None:
        super().__init__(spec)
        a, e, dt = spec.attention, spec.hidden_size, param_dtype
        q, kv, b = a.heads * a.head_dim, a.kv_heads * a.head_dim, a.qkv_bias
        self.k_proj = nnx.Linear(e, kv, use_bias=b, param_dtype=dt, rngs=rngs)
        self.v_proj = nnx.Linear(e, kv, use_bias=b, param_dtype=dt, rngs=rngs)
        self.q_proj = nnx.Linear(e, q, use_bias=b, param_dtype=dt, rngs=rngs)
        self.out_proj = nnx.Linear(q, e, use_bias=a.out_bias, param_dtype=dt, rngs=rngs)

    def project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        a, (n, length, _) = self.spec.attention, x.shape
        return tuple(p(x).reshape(n, length, -1, a.head_dim)
                     for p in (self.q_proj, self.k_proj, self.v_proj))

    def output(self, h: jax.Array) -> jax.Array:
        return self.out_proj(h)


class FcMLP(nnx.Module):
    """CLIP's and SigLIP's `fc2(act(fc1(x)))`."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, rngs: nnx.Rngs, param_dtype: Any
                 ) -> None:
        e, m, b, dt = spec.hidden_size, mlp.width, mlp.bias, param_dtype
        self.activation = mlp.activation
        self.fc1 = nnx.Linear(e, m, use_bias=b, param_dtype=dt, rngs=rngs)
        self.fc2 = nnx.Linear(m, e, use_bias=b, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(activation(self.activation)(self.fc1(x)))


ATTENTIONS: dict[str, type[SelfAttention]] = {"c_attn": FusedAttention, "qkvo": Attention,
                                              "qkv_proj": FusedQKVAttention,
                                              "query_key_value": QueryKeyValue,
                                              "out_proj": OutProjAttention}
MLPS: dict[str, type[nnx.Module]] = {"c_fc": MLP, "gated": GatedMLP, "gate_up": GateUpMLP,
                                     "dense": DenseMLP, "fc": FcMLP, "moe": SparseMoE}


class Block(nnx.Module):
    """Pre-norm residual block (and the optional post-norms of its branches): its modules are
    named and ordered by `spec.names.block`."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, rngs: nnx.Rngs, param_dtype: Any
                 ) -> None:
        e, dt = spec.hidden_size, param_dtype
        norm = lambda: make_norm(spec, e, dt, rngs)
        make = {"attention_norm": norm, "mlp_norm": norm, **dict.fromkeys(POST_ROLES, norm),
                "attention": lambda: ATTENTIONS[spec.attention.layout](
                    spec, rngs=rngs, param_dtype=dt),
                "mlp": lambda: MLPS[mlp.kind](spec, mlp, rngs=rngs, param_dtype=dt)}
        for name, role in spec.names.block:  # transformers' definition order
            place(self, name, make[role]())
        self.spec = spec
        self.sparse = mlp.kind == "moe"
        self.residual_dropout = nnx.Dropout(spec.residual_dropout)

    def part(self, role: str) -> nnx.Module:
        return at(self, self.spec.role(role))

    def post(self, role: str, h: jax.Array) -> jax.Array:
        """`h` through the post-norm `role`, if the block has one."""
        return self.part(role)(h) if self.spec.names.has(role) else h

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 inv_freq: np.ndarray | None, rngs: Rngs = None, index: jax.Array | int = 0,
                 router: list[jax.Array] | None = None) -> jax.Array:
        """The block's output; a mixture's router logits appended to `router`."""
        part, drop = self.part, lambda h: self.residual_dropout(h, rngs=rngs)
        h = part("attention")(part("attention_norm")(x), positions, mask, inv_freq, rngs, index)
        x = x + drop(self.post("attention_post_norm", h))
        normed = part("mlp_norm")(x)
        if router is not None and self.sparse:
            router.append(part("mlp").router_logits(normed))
        return x + drop(self.post("mlp_post_norm", part("mlp")(normed)))


class PostNormBlock(nnx.Module):
    """Post-norm residual block (BERT's layer): `attention_output(attention(x), x)`, then
    `mlp_output(mlp(x), x)`; its modules are named and ordered by `spec.names.block`."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, rngs: nnx.Rngs, param_dtype: Any
                 ) -> None:
        dt, q = param_dtype, spec.attention.heads * spec.attention.head_dim
        make = {"attention": lambda: ATTENTIONS[spec.attention.layout](
                    spec, rngs=rngs, param_dtype=dt),
                "attention_output": lambda: ResidualOutput(spec, q, rngs=rngs, param_dtype=dt),
                "mlp": lambda: MLPS[mlp.kind](spec, mlp, rngs=rngs, param_dtype=dt),
                "mlp_output": lambda: ResidualOutput(spec, mlp.width, rngs=rngs,
                                                     param_dtype=dt)}
        for name, role in spec.names.block:
            place(self, name, make[role]())
        self.spec = spec

    def part(self, role: str) -> nnx.Module:
        return at(self, self.spec.role(role))

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 inv_freq: np.ndarray | None, rngs: Rngs = None, index: jax.Array | int = 0,
                 router: list[jax.Array] | None = None) -> jax.Array:
        """The block's output (`router`: a pre-norm block's; no mixture here)."""
        part = self.part
        h = part("attention")(x, positions, mask, inv_freq, rngs, index)
        x = part("attention_output")(h, x, rngs)
        return part("mlp_output")(part("mlp")(x), x, rngs)


BLOCKS: dict[str, type[nnx.Module]] = {"pre": Block, "post": PostNormBlock}


class Decoder(nnx.Module):
    """Embedding (scaled, learned positions and token types, normed) -> dropout -> blocks
    (each with its layer's window and rotary frequencies) -> final norm (if any)."""

    def __init__(self, spec: DecoderSpec, *, rngs: nnx.Rngs, param_dtype: Any) -> None:
        names, e, dt = spec.names, spec.hidden_size, param_dtype
        init = nnx.initializers.normal(1.0)
        embed = lambda rows: nnx.Embed(rows, e, param_dtype=dt, embedding_init=init,
                                       rngs=rngs)
        place(self, names.embedding, embed(spec.vocab_size))
        if names.positions is not None:
            place(self, names.positions, embed(spec.max_positions))
        if names.token_types is not None:
            place(self, names.token_types, embed(spec.type_vocab_size))
        if names.embedding_norm is not None:
            place(self, names.embedding_norm, make_norm(spec, e, dt, rngs))
        self.embedding_dropout = nnx.Dropout(spec.embedding_dropout)
        place(self, names.layers, nnx.List([BLOCKS[spec.residual](spec, spec.mlp_of(i),
                                                                  rngs=rngs, param_dtype=dt)
                                            for i in range(spec.num_layers)]))
        if names.norm is not None:
            place(self, names.norm, make_norm(spec, e, dt, rngs))
        if names.pooler is not None:
            place(self, names.pooler, nnx.Linear(e, spec.pooling.size or e, param_dtype=dt,
                                                 rngs=rngs))
        self.spec = spec
        self.cache_index: nnx.Cache | None = nnx.data(None)  # init_cache

    def pool(self, h: jax.Array, input_ids: jax.Array | None = None) -> jax.Array:
        """The pooled output `(N, ...)` of the hidden states `h` `(N, L, hidden_size)`: the
        token `spec.pooling` says (of `input_ids`), then the pooler and tanh, if any."""
        p = self.spec.pooling
        x = h[jnp.arange(h.shape[0]), p.index(input_ids)]
        if self.spec.names.pooler is None:
            return x
        x = at(self, self.spec.names.pooler)(x)
        return jnp.tanh(x) if p.tanh else x

    def blocks(self) -> list[Block]:
        return list(at(self, self.spec.names.layers))

    def init_cache(self, batch: int, max_length: int, dtype: Any) -> None:
        a = self.spec.attention
        for block in self.blocks():
            init_kv_cache(block.part("attention"), batch, max_length, a.kv_heads, a.head_dim,
                          dtype)
        self.cache_index = nnx.Cache(jnp.zeros((), jnp.int32))

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None,
                 position_ids: jax.Array | None, rngs: Rngs = None,
                 token_type_ids: jax.Array | None = None,
                 router: list[jax.Array] | None = None) -> jax.Array:
        """The hidden states after the final norm, `(N, L, hidden_size)`; the sparse layers'
        router logits appended to `router`."""
        s, names, (n, length) = self.spec, self.spec.names, input_ids.shape
        index, kv_length = 0, None
        if self.cache_index is not None:
            index = self.cache_index[...]
            kv_length = self.blocks()[0].part("attention").cached_key.shape[1]
            self.cache_index[...] = index + length
        if position_ids is None and s.padding_idx is not None:
            position_ids = padded_positions(input_ids, s.padding_idx)
        positions = (index + default_positions(length)[None] if position_ids is None
                     else position_ids)
        positions = jnp.broadcast_to(positions, (n, length))
        h = at(self, names.embedding)(input_ids)
        if s.embedding_scale is not None:
            h = h * jnp.asarray(s.embedding_scale, h.dtype)
        if names.token_types is not None:
            types = jnp.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            h = h + at(self, names.token_types)(types)
        if names.positions is not None:
            h = h + at(self, names.positions)(positions)
        if names.embedding_norm is not None:
            h = at(self, names.embedding_norm)(h)
        h = self.embedding_dropout(h, rngs=rngs)
        masks = {w: sequence_mask(length, attention_mask, w, index, kv_length,
                                  s.attention.causal) for w in s.windows}
        for i, block in enumerate(self.blocks()):
            layer = s.layer(i)
            h = block(h, positions, masks[layer.sliding_window], layer.inv_freq, rngs, index,
                      router)
        return h if names.norm is None else at(self, names.norm)(h)

    def attend(self, h: jax.Array) -> jax.Array:
        """The tied head's logits: `h @ embedding.T`, promoted as `nnx.Embed.attend` does, with
        the table read where it lies (`zoo.layers.dense.contract`)."""
        embed = at(self, self.spec.names.embedding)
        table = embed.embedding[...]
        dtype = embed.dtype or jnp.result_type(h, table)
        return contract(h.astype(dtype), table.astype(dtype))


class CausalLM(nnx.Module):
    """The body (`spec.names.body`) and the head, tied or `lm_head`, its logits soft-capped
    when the spec says so."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs, param_dtype: Any = None) -> None:
        dt, spec = dtype_of(param_dtype), config.decoder
        self.config = config
        setattr(self, spec.names.body, Decoder(spec, rngs=rngs, param_dtype=dt))
        self.lm_head = (None if spec.tie_word_embeddings else
                        nnx.Linear(spec.hidden_size, spec.vocab_size, use_bias=False,
                                   param_dtype=dt, rngs=rngs))

    def body(self) -> Decoder:
        return getattr(self, self.config.decoder.names.body)

    def init_cache(self, batch: int, max_length: int, dtype: Any = None) -> None:
        """Give the model a KV cache of `batch` sequences of up to `max_length` tokens
        (`nnx.Cache` variables; `dtype`: the weights'). From then on each call takes the next
        slots, its `attention_mask` `(N, max_length)` covering every slot."""
        body = self.body()
        embedding = at(body, body.spec.names.embedding).embedding
        body.init_cache(batch, max_length, embedding.dtype if dtype is None else dtype)

    def encode(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
               position_ids: jax.Array | None = None, rngs: Rngs = None) -> jax.Array:
        """The last hidden states `(N, L, hidden_size)` (transformers' base model's)."""
        self.config.check_input(input_ids.shape)
        return self.body()(input_ids, attention_mask, position_ids, rngs)

    def __call__(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                 position_ids: jax.Array | None = None, rngs: Rngs = None) -> jax.Array:
        """Logits `(N, L, vocab)` of token ids `(N, L)`; `attention_mask` `(N, L)` (0: padding)
        and `position_ids` `(N, L)` (default `0 .. L-1`) as transformers'. With the spec's
        `output_router_logits` (and no cache), `(logits, router_logits (N, layers, L,
        experts))`."""
        self.config.check_input(input_ids.shape)
        body, spec = self.body(), self.config.decoder
        router = ([] if spec.output_router_logits and body.cache_index is None else None)
        h = body(input_ids, attention_mask, position_ids, rngs, router=router)
        logits = body.attend(h) if self.lm_head is None else self.lm_head(h)
        logits = softcap(logits, spec.logit_softcap)
        return logits if router is None else (logits, jnp.stack(router, axis=1))
