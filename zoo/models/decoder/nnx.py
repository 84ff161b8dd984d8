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
from zoo.models.decoder.spec import (
    MLP_KINDS,
    POST_ROLES,
    DecoderSpec,
    MLPSpec,
    Projections,
    attention_projections,
    mlp_projections,
    padded_positions,
)

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


def make_projections(p: Projections, dtype: Any, rngs: nnx.Rngs
                     ) -> list[tuple[str, nnx.Module]]:
    """`p`'s layers, in definition order (`Conv1D` or `nnx.Linear`)."""
    return [(layer.name, (Conv1D if layer.conv1d else nnx.Linear)(
        layer.inputs, layer.outputs, use_bias=layer.bias, param_dtype=dtype, rngs=rngs))
        for layer in p.layers]


def parts(module: nnx.Module, p: Projections, x: jax.Array) -> list[jax.Array]:
    """The parts of `x`: one per projection, or one projection's output split."""
    outs = [getattr(module, name)(x) for name in p.parts]
    return outs if not p.splits else jnp.split(outs[0], p.splits, axis=-1)


class Attention(nnx.Module):
    """Self-attention, its projections as the spec's layout says (`attention_projections`):
    grouped key/value heads, per-head `q_norm` / `k_norm` with `qk_norm`, rotary positions with
    the layer's inverse frequencies `inv_freq` when it has them, a sliding window through the
    mask, the spec's scale and soft-capping."""

    def __init__(self, spec: DecoderSpec, *, rngs: nnx.Rngs, param_dtype: Any) -> None:
        a = spec.attention
        self.spec = spec
        self.dropout = nnx.Dropout(a.dropout)
        self.cached_key: nnx.Cache | None = nnx.data(None)  # init_kv_cache
        self.cached_value: nnx.Cache | None = nnx.data(None)
        for name, layer in make_projections(attention_projections(spec), param_dtype, rngs):
            setattr(self, name, layer)
        if a.qk_norm:
            self.q_norm, self.k_norm = (make_norm(spec, a.head_dim, param_dtype, rngs)
                                        for _ in "qk")

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 inv_freq: np.ndarray | None, rngs: Rngs = None, index: jax.Array | int = 0
                 ) -> jax.Array:
        a, p, (n, length, _) = self.spec.attention, attention_projections(self.spec), x.shape
        q, k, v = (t.reshape(n, length, -1, a.head_dim) for t in parts(self, p, x))
        if a.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if inv_freq is not None:
            q, k = rotary(q, positions, inv_freq), rotary(k, positions, inv_freq)
        k, v = cached_kv(self, k, v, index)
        out = attend(q, k, v, mask, a.scaling, lambda w: self.dropout(w, rngs=rngs),
                     a.logit_softcap).reshape(n, length, -1)
        return out if p.output is None else getattr(self, p.output)(out)


class MLP(nnx.Module):
    """An MLP, its projections as its kind says (`mlp_projections`): `out(act(up(x)))`, or
    `out(act(gate(x)) * up(x))` gated, without `out` where it has none."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, rngs: nnx.Rngs, param_dtype: Any
                 ) -> None:
        self.activation, self.gated = mlp.activation, mlp.gated
        self.projections = mlp_projections(spec, mlp)
        for name, layer in make_projections(self.projections, param_dtype, rngs):
            setattr(self, name, layer)

    def __call__(self, x: jax.Array) -> jax.Array:
        p, act = self.projections, activation(self.activation)
        h = parts(self, p, x)
        h = act(h[0]) * h[1] if self.gated else act(h[0])
        return h if p.output is None else getattr(self, p.output)(h)


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


MLPS: dict[str, type[nnx.Module]] = {**dict.fromkeys(MLP_KINDS, MLP), "moe": SparseMoE}


class Block(nnx.Module):
    """Pre-norm residual block (and the optional post-norms of its branches): its modules are
    named and ordered by `spec.names.block`."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, rngs: nnx.Rngs, param_dtype: Any
                 ) -> None:
        e, dt = spec.hidden_size, param_dtype
        norm = lambda: make_norm(spec, e, dt, rngs)
        make = {"attention_norm": norm, "mlp_norm": norm, **dict.fromkeys(POST_ROLES, norm),
                "attention": lambda: Attention(spec, rngs=rngs, param_dtype=dt),
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
        make = {"attention": lambda: Attention(spec, rngs=rngs, param_dtype=dt),
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
