"""The decoder body in Flax Linen, batched `(N, L)`: the modules a `DecoderSpec` declares,
named as its `Names` say. A tied head is `embedding.attend` (no array of its own).
`decode=True` keeps a KV cache in the "cache" collection, as Flax's attention does."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import canonical
from zoo.layers.causal import attend, default_positions, rotary, sequence_mask, softcap
from zoo.layers.dense import contract
from zoo.layers.linen import (
    Conv1D,
    LayerNorm,
    OffsetRMSNorm,
    RMSNorm,
    cache_index,
    cached_kv,
)
from zoo.layers.moe import DISPATCHES, route
from zoo.models.common import activation, dtype_of
from zoo.models.decoder.spec import POST_ROLES, DecoderSpec, MLPSpec, padded_positions

NORMS: dict[str, type[nn.Module]] = {"layer_norm": LayerNorm, "rms_norm": RMSNorm,
                                     "offset_rms_norm": OffsetRMSNorm}


def make_norm(spec: DecoderSpec, dtype: jnp.dtype) -> nn.Module:
    return NORMS[spec.norm](epsilon=spec.norm_eps, param_dtype=dtype)


Maker = Callable[[], Any]  # builds a module (or a list of modules) inside `setup`


class Param:
    """A maker of a bare parameter (zeros of `shape`) held by a `Container`."""

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = shape, dtype


class Container(nn.Module):
    """A plain node of transformers' nesting (the `attention` of `attention.self`): its
    children made in its `setup` (`nest`), modules or bare parameters (`Param`)."""

    makers: tuple[tuple[str, Maker | Param], ...]

    def setup(self) -> None:
        for name, make in self.makers:
            setattr(self, name, self.param(name, nn.initializers.zeros, make.shape, make.dtype)
                    if isinstance(make, Param) else make())


def nest(items: list[tuple[str, Maker | Param]]) -> list[tuple[str, Maker | Param]]:
    """`(dotted path, maker)` pairs as `(attribute, maker)` pairs of their holder's `setup`,
    the makers below a first part gathered in a `Container` (recursively), in order."""
    groups: dict[str, list[tuple[str, Maker | Param]]] = {}
    for path, make in items:
        head, _, rest = path.partition(".")
        groups.setdefault(head, []).append((rest, make))
    return [(head, group[0][1]) if group[0][0] == "" else
            (head, functools.partial(Container, tuple(nest(group))))
            for head, group in groups.items()]


def at(module: Any, path: str) -> Any:
    """The module at the dotted `path` under `module`."""
    return functools.reduce(getattr, path.split("."), module)


class SelfAttention(nn.Module):
    """Causal self-attention (grouped key/value heads, rotary positions with the layer's
    inverse frequencies `inv_freq` when it has them, a sliding window through the mask, the
    spec's scale and soft-capping); a layout adds its projections in `setup` and defines
    `project` (queries, keys, values `(N, L, heads, D)`) and `output`."""

    spec: DecoderSpec
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        self.dropout = nn.Dropout(self.spec.attention.dropout)

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 inv_freq: np.ndarray | None, train: bool, index: jax.Array | int = 0
                 ) -> jax.Array:
        a, (n, length, _) = self.spec.attention, x.shape
        q, k, v = self.project(x)
        if inv_freq is not None:
            q, k = rotary(q, positions, inv_freq), rotary(k, positions, inv_freq)
        if self.decode:
            k, v = cached_kv(self, k, v, index)
        out = attend(q, k, v, mask, a.scaling, lambda w: self.dropout(w, deterministic=not train),
                     a.logit_softcap)
        return self.output(out.reshape(n, length, -1))


class FusedAttention(SelfAttention):
    """GPT-2's `c_attn` (queries, keys and values in one `Conv1D`) and `c_proj`."""

    def setup(self) -> None:
        super().setup()
        dt, e = dtype_of(self.param_dtype), self.spec.hidden_size
        self.c_attn = Conv1D(3 * e, param_dtype=dt)
        self.c_proj = Conv1D(e, param_dtype=dt)

    def project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        n, length, _ = x.shape
        return tuple(t.reshape(n, length, self.spec.attention.heads, -1)
                     for t in jnp.split(self.c_attn(x), 3, axis=-1))

    def output(self, h: jax.Array) -> jax.Array:
        return self.c_proj(h)


class Attention(SelfAttention):
    """`q_proj`, `k_proj`, `v_proj`, `o_proj` and, with `qk_norm`, per-head `q_norm` and
    `k_norm` over `head_dim`."""

    def setup(self) -> None:
        super().setup()
        a, dt, e = self.spec.attention, dtype_of(self.param_dtype), self.spec.hidden_size
        self.q_proj = nn.Dense(a.heads * a.head_dim, use_bias=a.qkv_bias, param_dtype=dt)
        self.k_proj = nn.Dense(a.kv_heads * a.head_dim, use_bias=a.qkv_bias, param_dtype=dt)
        self.v_proj = nn.Dense(a.kv_heads * a.head_dim, use_bias=a.qkv_bias, param_dtype=dt)
        self.o_proj = nn.Dense(e, use_bias=a.out_bias, param_dtype=dt)
        self.q_norm = make_norm(self.spec, dt) if a.qk_norm else None
        self.k_norm = make_norm(self.spec, dt) if a.qk_norm else None

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

    def setup(self) -> None:
        super().setup()
        a, dt, e = self.spec.attention, dtype_of(self.param_dtype), self.spec.hidden_size
        self.o_proj = nn.Dense(e, use_bias=a.out_bias, param_dtype=dt)
        self.qkv_proj = nn.Dense(sum(a.qkv_sizes), use_bias=a.qkv_bias, param_dtype=dt)

    def project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        a, (n, length, _) = self.spec.attention, x.shape
        q, kv, _ = a.qkv_sizes
        return tuple(t.reshape(n, length, -1, a.head_dim)
                     for t in jnp.split(self.qkv_proj(x), (q, q + kv), axis=-1))

    def output(self, h: jax.Array) -> jax.Array:
        return self.o_proj(h)


class MLP(nn.Module):
    """GPT-2's `c_proj(act(c_fc(x)))` (`Conv1D`s)."""

    spec: DecoderSpec
    mlp: MLPSpec
    param_dtype: str = "float32"

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        self.c_fc = Conv1D(self.mlp.width, param_dtype=dt)
        self.c_proj = Conv1D(self.spec.hidden_size, param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.c_proj(activation(self.mlp.activation)(self.c_fc(x)))


class GatedMLP(nn.Module):
    """`down_proj(act(gate_proj(x)) * up_proj(x))` (SwiGLU with `silu`)."""

    spec: DecoderSpec
    mlp: MLPSpec
    param_dtype: str = "float32"

    def setup(self) -> None:
        m, dt = self.mlp, dtype_of(self.param_dtype)
        self.gate_proj = nn.Dense(m.width, use_bias=m.bias, param_dtype=dt)
        self.up_proj = nn.Dense(m.width, use_bias=m.bias, param_dtype=dt)
        self.down_proj = nn.Dense(self.spec.hidden_size, use_bias=m.bias, param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        act = activation(self.mlp.activation)
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))


class GateUpMLP(nn.Module):
    """Phi-3's `down_proj(act(gate) * up)`, gate and up from one `gate_up_proj` (gate first)."""

    spec: DecoderSpec
    mlp: MLPSpec
    param_dtype: str = "float32"

    def setup(self) -> None:
        m, dt = self.mlp, dtype_of(self.param_dtype)
        self.gate_up_proj = nn.Dense(2 * m.width, use_bias=m.bias, param_dtype=dt)
        self.down_proj = nn.Dense(self.spec.hidden_size, use_bias=m.bias, param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = jnp.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(up * activation(self.mlp.activation)(gate))


class Experts(nn.Module):
    """A mixture's experts (layer kind `experts`): `gate_up_proj` `(E, hidden, 2 * width)` and
    `down_proj` `(E, width, hidden)`, transformers' fused weights as kernels, over tokens
    `(T, hidden)` and their routing, computed by `dispatch` (`zoo.layers.moe`)."""

    experts: int
    width: int
    activation: str
    dispatch: str = "sorted"
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, weights: jax.Array, experts: jax.Array) -> jax.Array:
        e, hidden = self.experts, x.shape[-1]
        init = nn.initializers.lecun_normal(in_axis=1, out_axis=2, batch_axis=(0,))
        gate_up = self.param("gate_up_proj", init, (e, hidden, 2 * self.width), self.param_dtype)
        down = self.param("down_proj", init, (e, self.width, hidden), self.param_dtype)
        dtype = jnp.result_type(x, gate_up)
        return DISPATCHES[self.dispatch](x.astype(dtype), weights, experts,
                                         gate_up.astype(dtype), down.astype(dtype),
                                         activation(self.activation))


canonical.register_class("experts", "linen", Experts)


class SparseMoE(nn.Module):
    """A mixture of experts (transformers' sparse MoE block): the router `gate` (a Dense
    without bias, one logit per expert), softmax, top-k routing, the `experts` (defined in
    transformers' order, `MoESpec.router_first`)."""

    spec: DecoderSpec
    mlp: MLPSpec
    param_dtype: str = "float32"

    def setup(self) -> None:
        m, dt = self.mlp.moe, dtype_of(self.param_dtype)
        make = {"gate": lambda: nn.Dense(m.experts, use_bias=False, param_dtype=dt),
                "experts": lambda: Experts(m.experts, self.mlp.width, self.mlp.activation,
                                           m.dispatch, param_dtype=dt)}
        for name in ("gate", "experts") if m.router_first else ("experts", "gate"):
            setattr(self, name, make[name]())

    def router_logits(self, x: jax.Array) -> jax.Array:
        """The router's logits `(N, L, experts)`."""
        return self.gate(x)

    def __call__(self, x: jax.Array) -> jax.Array:
        m, flat = self.mlp.moe, x.reshape(-1, x.shape[-1])
        weights, experts = route(self.gate(flat), m.top_k, m.normalize)
        return self.experts(flat, weights, experts).reshape(x.shape)


class QueryKeyValue(SelfAttention):
    """BERT's `query`, `key`, `value` (its output projection: the block's `attention_output`,
    `ResidualOutput`)."""

    def setup(self) -> None:
        super().setup()
        a, dt = self.spec.attention, dtype_of(self.param_dtype)
        self.query = nn.Dense(a.heads * a.head_dim, use_bias=a.qkv_bias, param_dtype=dt)
        self.key = nn.Dense(a.heads * a.head_dim, use_bias=a.qkv_bias, param_dtype=dt)
        self.value = nn.Dense(a.heads * a.head_dim, use_bias=a.qkv_bias, param_dtype=dt)

    def project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        a, (n, length, _) = self.spec.attention, x.shape
        return tuple(p(x).reshape(n, length, a.heads, a.head_dim)
                     for p in (self.query, self.key, self.value))

    def output(self, h: jax.Array) -> jax.Array:
        return h


class DenseMLP(nn.Module):
    """BERT's intermediate, `act(dense(x))` (its second matrix: the block's `mlp_output`)."""

    spec: DecoderSpec
    mlp: MLPSpec
    param_dtype: str = "float32"

    def setup(self) -> None:
        m = self.mlp
        self.dense = nn.Dense(m.width, use_bias=m.bias, param_dtype=dtype_of(self.param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        return activation(self.mlp.activation)(self.dense(x))


class ResidualOutput(nn.Module):
    """A post-norm branch's end, `LayerNorm(dropout(dense(h)) + x)` (BERT's `BertSelfOutput`,
    `BertOutput`)."""

    spec: DecoderSpec
    param_dtype: str = "float32"

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        self.dense = nn.Dense(self.spec.hidden_size, param_dtype=dt)
        self.LayerNorm = make_norm(self.spec, dt)
        self.dropout = nn.Dropout(self.spec.residual_dropout)

    def __call__(self, h: jax.Array, x: jax.Array, train: bool) -> jax.Array:
        return self.LayerNorm(self.dropout(self.dense(h), deterministic=not train) + x)


class OutProjAttention(SelfAttention):
    """CLIP's and SigLIP's `k_proj`, `v_proj`, `q_proj`, `out_proj` (transformers' order)."""

    def setup(self) -> None:
        super().setup()
        a, dt, e = self.spec.attention, dtype_of(self.param_dtype), self.spec.hidden_size
        self.k_proj = nn.Dense(a.kv_heads * a.head_dim, use_bias=a.qkv_bias, param_dtype=dt)
        self.v_proj = nn.Dense(a.kv_heads * a.head_dim, use_bias=a.qkv_bias, param_dtype=dt)
        self.q_proj = nn.Dense(a.heads * a.head_dim, use_bias=a.qkv_bias, param_dtype=dt)
        self.out_proj = nn.Dense(e, use_bias=a.out_bias, param_dtype=dt)

    def project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        a, (n, length, _) = self.spec.attention, x.shape
        return tuple(p(x).reshape(n, length, -1, a.head_dim)
                     for p in (self.q_proj, self.k_proj, self.v_proj))

    def output(self, h: jax.Array) -> jax.Array:
        return self.out_proj(h)


class FcMLP(nn.Module):
    """CLIP's and SigLIP's `fc2(act(fc1(x)))`."""

    spec: DecoderSpec
    mlp: MLPSpec
    param_dtype: str = "float32"

    def setup(self) -> None:
        m, dt = self.mlp, dtype_of(self.param_dtype)
        self.fc1 = nn.Dense(m.width, use_bias=m.bias, param_dtype=dt)
        self.fc2 = nn.Dense(self.spec.hidden_size, use_bias=m.bias, param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(activation(self.mlp.activation)(self.fc1(x)))


ATTENTIONS: dict[str, type[SelfAttention]] = {"c_attn": FusedAttention, "qkvo": Attention,
                                              "qkv_proj": FusedQKVAttention,
                                              "query_key_value": QueryKeyValue,
                                              "out_proj": OutProjAttention}
MLPS: dict[str, type[nn.Module]] = {"c_fc": MLP, "gated": GatedMLP, "gate_up": GateUpMLP,
                                    "dense": DenseMLP, "fc": FcMLP, "moe": SparseMoE}


class Block(nn.Module):
    """Pre-norm residual block (and the optional post-norms of its branches): its modules are
    named and ordered by `spec.names.block`."""

    spec: DecoderSpec
    param_dtype: str = "float32"
    decode: bool = False
    mlp_spec: MLPSpec | None = None  # this layer's (None: the spec's)

    def setup(self) -> None:
        s, dt, mlp = self.spec, dtype_of(self.param_dtype), self.mlp_spec or self.spec.mlp
        norm = lambda: make_norm(s, dt)
        make = {"attention_norm": norm, "mlp_norm": norm, **dict.fromkeys(POST_ROLES, norm),
                "attention": lambda: ATTENTIONS[s.attention.layout](
                    s, self.param_dtype, self.decode),
                "mlp": lambda: MLPS[mlp.kind](s, mlp, self.param_dtype)}
        for name, maker in nest([(n, make[role]) for n, role in s.names.block]):
            setattr(self, name, maker())  # transformers' definition order
        self.residual_dropout = nn.Dropout(s.residual_dropout)

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 inv_freq: np.ndarray | None, train: bool, index: jax.Array | int = 0,
                 router: list[jax.Array] | None = None) -> jax.Array:
        """The block's output; a mixture's router logits appended to `router`."""
        names = self.spec.names
        part = lambda role: at(self, self.spec.role(role))
        post = lambda role, h: part(role)(h) if names.has(role) else h
        drop = lambda h: self.residual_dropout(h, deterministic=not train)
        h = part("attention")(part("attention_norm")(x), positions, mask, inv_freq, train, index)
        x = x + drop(post("attention_post_norm", h))
        normed = part("mlp_norm")(x)
        if router is not None and (self.mlp_spec or self.spec.mlp).kind == "moe":
            router.append(part("mlp").router_logits(normed))
        return x + drop(post("mlp_post_norm", part("mlp")(normed)))


class PostNormBlock(nn.Module):
    """Post-norm residual block (BERT's layer): `attention_output(attention(x), x)`, then
    `mlp_output(mlp(x), x)`; its modules are named and ordered by `spec.names.block`."""

    spec: DecoderSpec
    param_dtype: str = "float32"
    decode: bool = False
    mlp_spec: MLPSpec | None = None  # this layer's (None: the spec's)

    def setup(self) -> None:
        s, dt, mlp = self.spec, self.param_dtype, self.mlp_spec or self.spec.mlp
        make = {"attention": lambda: ATTENTIONS[s.attention.layout](s, dt, self.decode),
                "attention_output": lambda: ResidualOutput(s, dt),
                "mlp": lambda: MLPS[mlp.kind](s, mlp, dt),
                "mlp_output": lambda: ResidualOutput(s, dt)}
        for name, maker in nest([(n, make[role]) for n, role in s.names.block]):
            setattr(self, name, maker())

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 inv_freq: np.ndarray | None, train: bool, index: jax.Array | int = 0,
                 router: list[jax.Array] | None = None) -> jax.Array:
        """The block's output (`router`: a pre-norm block's; no mixture here)."""
        part = lambda role: at(self, self.spec.role(role))
        h = part("attention")(x, positions, mask, inv_freq, train, index)
        x = part("attention_output")(h, x, train)
        return part("mlp_output")(part("mlp")(x), x, train)


BLOCKS: dict[str, type[nn.Module]] = {"pre": Block, "post": PostNormBlock}


class Decoder(nn.Module):
    """Embedding (scaled, learned positions and token types, normed) -> dropout -> blocks
    (each with its layer's window and rotary frequencies) -> final norm (if any)."""

    spec: DecoderSpec
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        s, names, dt = self.spec, self.spec.names, dtype_of(self.param_dtype)
        init = nn.initializers.normal(1.0)
        embed = lambda rows: lambda: nn.Embed(rows, s.hidden_size, param_dtype=dt,
                                              embedding_init=init)
        items = [(names.embedding, embed(s.vocab_size))]
        if names.positions is not None:
            items.append((names.positions, embed(s.max_positions)))
        if names.token_types is not None:
            items.append((names.token_types, embed(s.type_vocab_size)))
        if names.embedding_norm is not None:
            items.append((names.embedding_norm, lambda: make_norm(s, dt)))
        items.append((names.layers, lambda: [BLOCKS[s.residual](s, self.param_dtype,
                                                                self.decode, s.mlp_of(i))
                                             for i in range(s.num_layers)]))
        if names.norm is not None:
            items.append((names.norm, lambda: make_norm(s, dt)))
        if names.pooler is not None:
            items.append((names.pooler, lambda: nn.Dense(s.pooling.size or s.hidden_size,
                                                         param_dtype=dt)))
        for name, maker in nest(items):
            setattr(self, name, maker())
        self.embedding_dropout = nn.Dropout(s.embedding_dropout)

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None,
                 position_ids: jax.Array | None, train: bool,
                 token_type_ids: jax.Array | None = None,
                 router: list[jax.Array] | None = None) -> jax.Array:
        """The hidden states after the final norm, `(N, L, hidden_size)`; the sparse layers'
        router logits appended to `router`."""
        s, names, (n, length) = self.spec, self.spec.names, input_ids.shape
        index = cache_index(self, length) if self.decode else 0
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
        h = self.embedding_dropout(h, deterministic=not train)
        kv_length = None if attention_mask is None else attention_mask.shape[-1]
        masks = {w: sequence_mask(length, attention_mask, w, index, kv_length,
                                  s.attention.causal) for w in s.windows}
        for i, block in enumerate(at(self, names.layers)):
            layer = s.layer(i)
            h = block(h, positions, masks[layer.sliding_window], layer.inv_freq, train, index,
                      router)
        h = h if names.norm is None else at(self, names.norm)(h)
        if names.pooler is not None:  # called (its result unused: compiled away) so that its
            self.pool(h, input_ids)  # parameters exist and the walkers see it
        return h

    def pool(self, h: jax.Array, input_ids: jax.Array | None = None) -> jax.Array:
        """The pooled output `(N, ...)` of the hidden states `h` `(N, L, hidden_size)`: the
        token `spec.pooling` says (of `input_ids`), then the pooler and tanh, if any."""
        p = self.spec.pooling
        x = h[jnp.arange(h.shape[0]), p.index(input_ids)]
        if self.spec.names.pooler is None:
            return x
        x = at(self, self.spec.names.pooler)(x)
        return jnp.tanh(x) if p.tanh else x

    def attend(self, h: jax.Array) -> jax.Array:
        """The tied head's logits: `h @ embedding.T`, promoted as `nn.Embed.attend` does, with
        the table read where it lies (`zoo.layers.dense.contract`)."""
        embed = at(self, self.spec.names.embedding)
        table = embed.embedding
        dtype = embed.dtype or jnp.result_type(h, table)
        return contract(h.astype(dtype), table.astype(dtype))


class CausalLM(nn.Module):
    """The body (`spec.names.body`) and the head, tied or `lm_head` (its logits soft-capped
    when the spec says so). `decode=True`: a KV cache
    in the "cache" collection, Flax's idiom. `init` with a full-length batch
    `(N, max_length)` creates it (empty); each call then takes the next slots, its
    `attention_mask` `(N, max_length)` covering every slot, `mutable=["cache"]`."""

    config: Any  # a LanguageModelConfig: its `decoder` spec
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        s = self.config.decoder
        setattr(self, s.names.body, Decoder(s, self.param_dtype, self.decode))
        self.lm_head = (None if s.tie_word_embeddings else
                        nn.Dense(s.vocab_size, use_bias=False,
                                 param_dtype=dtype_of(self.param_dtype)))

    def encode(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
               position_ids: jax.Array | None = None, train: bool = False) -> jax.Array:
        """The last hidden states `(N, L, hidden_size)` (transformers' base model's)."""
        self.config.check_input(input_ids.shape)
        body = getattr(self, self.config.decoder.names.body)
        return body(input_ids, attention_mask, position_ids, train)

    def __call__(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                 position_ids: jax.Array | None = None, train: bool = False) -> jax.Array:
        """Logits `(N, L, vocab)` of token ids `(N, L)`; `attention_mask` `(N, L)` (0: padding)
        and `position_ids` `(N, L)` (default `0 .. L-1`) as transformers'. With the spec's
        `output_router_logits` (and no cache), `(logits, router_logits (N, layers, L,
        experts))`."""
        self.config.check_input(input_ids.shape)
        spec = self.config.decoder
        body = getattr(self, spec.names.body)
        router = [] if spec.output_router_logits and not self.decode else None
        h = body(input_ids, attention_mask, position_ids, train, router=router)
        logits = body.attend(h) if self.lm_head is None else self.lm_head(h)
        logits = softcap(logits, spec.logit_softcap)
        return logits if router is None else (logits, jnp.stack(router, axis=1))
