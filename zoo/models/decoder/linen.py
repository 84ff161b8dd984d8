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


def make_projections(p: Projections, dtype: Any) -> list[tuple[str, nn.Module]]:
    """`p`'s layers, in definition order (`Conv1D` or `nn.Dense`)."""
    return [(layer.name, (Conv1D if layer.conv1d else nn.Dense)(
        layer.outputs, use_bias=layer.bias, param_dtype=dtype)) for layer in p.layers]


def parts(module: nn.Module, p: Projections, x: jax.Array) -> list[jax.Array]:
    """The parts of `x`: one per projection, or one projection's output split."""
    outs = [getattr(module, name)(x) for name in p.parts]
    return outs if not p.splits else jnp.split(outs[0], p.splits, axis=-1)


class Attention(nn.Module):
    """Self-attention, its projections as the spec's layout says (`attention_projections`):
    grouped key/value heads, per-head `q_norm` / `k_norm` with `qk_norm`, rotary positions with
    the layer's inverse frequencies `inv_freq` when it has them, a sliding window through the
    mask, the spec's scale and soft-capping."""

    spec: DecoderSpec
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        dt, a = dtype_of(self.param_dtype), self.spec.attention
        for name, layer in make_projections(attention_projections(self.spec), dt):
            setattr(self, name, layer)
        if a.qk_norm:
            self.q_norm, self.k_norm = make_norm(self.spec, dt), make_norm(self.spec, dt)
        self.dropout = nn.Dropout(a.dropout)

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 inv_freq: np.ndarray | None, train: bool, index: jax.Array | int = 0
                 ) -> jax.Array:
        a, p, (n, length, _) = self.spec.attention, attention_projections(self.spec), x.shape
        q, k, v = (t.reshape(n, length, -1, a.head_dim) for t in parts(self, p, x))
        if a.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if inv_freq is not None:
            q, k = rotary(q, positions, inv_freq), rotary(k, positions, inv_freq)
        if self.decode:
            k, v = cached_kv(self, k, v, index)
        out = attend(q, k, v, mask, a.scaling, lambda w: self.dropout(w, deterministic=not train),
                     a.logit_softcap).reshape(n, length, -1)
        return out if p.output is None else getattr(self, p.output)(out)


class MLP(nn.Module):
    """An MLP, its projections as its kind says (`mlp_projections`): `out(act(up(x)))`, or
    `out(act(gate(x)) * up(x))` gated, without `out` where it has none."""

    spec: DecoderSpec
    mlp: MLPSpec
    param_dtype: str = "float32"

    def setup(self) -> None:
        p = mlp_projections(self.spec, self.mlp)
        for name, layer in make_projections(p, dtype_of(self.param_dtype)):
            setattr(self, name, layer)

    def __call__(self, x: jax.Array) -> jax.Array:
        p, act = mlp_projections(self.spec, self.mlp), activation(self.mlp.activation)
        h = parts(self, p, x)
        h = act(h[0]) * h[1] if self.mlp.gated else act(h[0])
        return h if p.output is None else getattr(self, p.output)(h)


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


MLPS: dict[str, type[nn.Module]] = {**dict.fromkeys(MLP_KINDS, MLP), "moe": SparseMoE}


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
                "attention": lambda: Attention(s, self.param_dtype, self.decode),
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
        make = {"attention": lambda: Attention(s, dt, self.decode),
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
