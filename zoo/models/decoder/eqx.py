"""The decoder body in Equinox, one sequence `(L,)` per call (batched with vmap): the modules a
`DecoderSpec` declares, named as its `Names` say (`Block` and `Decoder` take their fields from
the names: `named`). A tied head is `h @ embedding.weight.T` (`contract`: no array of its own,
no transpose). Decoding threads an explicit `KVCache` through the call (`init_cache`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PRNGKeyArray

import canonical
from zoo.layers.causal import (
    attend,
    default_positions,
    rotary,
    sequence_mask,
    softcap,
    write_cache,
)
from zoo.layers.dense import contract
from zoo.layers.eqx import Conv1D, KVCache, LayerNorm, Linear, OffsetRMSNorm, RMSNorm
from zoo.layers.moe import dense_experts, route
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

KV = tuple[Array, Array]  # one layer's cached keys and values
Key = PRNGKeyArray | None


def _keys(key: Key, n: int) -> list[Key]:
    return [None] * n if key is None else list(jax.random.split(key, n))


def _tokenwise(layer: eqx.Module, x: Array) -> Array:
    return jax.vmap(layer)(x)


NORMS: dict[str, Callable[..., eqx.Module]] = {
    "layer_norm": LayerNorm, "rms_norm": functools.partial(RMSNorm, use_bias=False),
    "offset_rms_norm": OffsetRMSNorm}


def make_norm(spec: DecoderSpec, size: int, dtype: Any) -> eqx.Module:
    return NORMS[spec.norm](size, eps=spec.norm_eps, dtype=dtype)


@functools.cache
def named(base: type[eqx.Module], fields: tuple[str, ...]) -> type[eqx.Module]:
    """`base` with one field per name of `fields`, in that order (transformers' names and
    definition order: the model's key paths)."""
    return type(base.__name__, (base,), {"__annotations__": dict.fromkeys(fields, Any),
                                          "__module__": base.__module__})


class Container(eqx.Module):
    """A plain node of transformers' nesting (the `attention` of `attention.self`): one field
    per child, set by `nest`."""

    def __init__(container, **children: Any) -> None:
        for name, child in children.items():
            setattr(container, name, child)


def top_names(paths: list[str]) -> tuple[str, ...]:
    """The first parts of dotted `paths`, in order: the fields of the module holding them."""
    return tuple(dict.fromkeys(p.split(".")[0] for p in paths))


def nest(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """`(dotted path, module)` pairs as `(field, module)` pairs of their holder, the modules
    below a first part gathered in a `Container` (recursively), in order."""
    groups: dict[str, list[tuple[str, Any]]] = {}
    for path, module in items:
        head, _, rest = path.partition(".")
        groups.setdefault(head, []).append((rest, module))
    out = []
    for head, group in groups.items():
        if group[0][0] == "":
            out.append((head, group[0][1]))
        else:
            children = nest(group)
            out.append((head, named(Container, top_names([n for n, _ in children]))(
                **dict(children))))
    return out


def at(module: Any, path: str) -> Any:
    """The module at the dotted `path` under `module`."""
    return functools.reduce(getattr, path.split("."), module)


def make_projections(p: Projections, *, key: PRNGKeyArray, dtype: Any
                     ) -> list[tuple[str, eqx.Module]]:
    """`p`'s layers, in definition order, each with its key (drawn for the parts' layers
    first, then the output's)."""
    order = sorted(range(len(p.layers)), key=lambda i: p.layers[i].role == "out")
    keys = dict(zip(order, [key] if len(order) == 1 else jax.random.split(key, len(order)),
                    strict=True))
    return [(layer.name, (Conv1D if layer.conv1d else Linear)(
        layer.inputs, layer.outputs, use_bias=layer.bias, key=keys[i], dtype=dtype))
        for i, layer in enumerate(p.layers)]


def parts(module: eqx.Module, p: Projections, x: Array) -> list[Array]:
    """The parts `(L, size)` of `x` `(L, hidden)`: one per projection, or one output split."""
    outs = [_tokenwise(getattr(module, name), x) for name in p.parts]
    return outs if not p.splits else jnp.split(outs[0], p.splits, axis=-1)


class Attention(eqx.Module):
    """Self-attention over one sequence, its projections as the spec's layout says
    (`attention_projections`; `make_attention` names its fields): grouped key/value heads,
    per-head `q_norm` / `k_norm` with `qk_norm`, rotary positions with the layer's inverse
    frequencies `inv_freq` when it has them, a sliding window through the mask, the spec's
    scale and soft-capping."""

    dropout: eqx.nn.Dropout
    spec: DecoderSpec = eqx.field(static=True)

    def __init__(self, spec: DecoderSpec, *, key: PRNGKeyArray, dtype: Any) -> None:
        a = spec.attention
        for name, layer in make_projections(attention_projections(spec), key=key, dtype=dtype):
            setattr(self, name, layer)
        if a.qk_norm:
            self.q_norm, self.k_norm = (make_norm(spec, a.head_dim, dtype) for _ in "qk")
        self.dropout = eqx.nn.Dropout(a.dropout)
        self.spec = spec

    def __call__(self, x: Array, positions: Array, mask: Array, inv_freq: np.ndarray | None,
                 kv: KV | None = None, index: Array | int = 0, *, key: Key = None
                 ) -> tuple[Array, KV | None]:
        """The attention's output and, given the cached `kv`, the cache with this call's keys
        and values written at `index`."""
        a, p = self.spec.attention, attention_projections(self.spec)
        q, k, v = (t.reshape(x.shape[0], -1, a.head_dim) for t in parts(self, p, x))
        if a.qk_norm:  # per head, over head_dim
            q, k = jax.vmap(jax.vmap(self.q_norm))(q), jax.vmap(jax.vmap(self.k_norm))(k)
        if inv_freq is not None:
            q, k = rotary(q, positions, inv_freq), rotary(k, positions, inv_freq)
        if kv is not None:
            kv = k, v = write_cache(kv[0], k, index, 0), write_cache(kv[1], v, index, 0)
        out = attend(q, k, v, mask, a.scaling, functools.partial(self.dropout, key=key),
                     a.logit_softcap).reshape(x.shape[0], -1)
        return (out if p.output is None else _tokenwise(getattr(self, p.output), out)), kv


def make_attention(spec: DecoderSpec, *, key: PRNGKeyArray, dtype: Any) -> Attention:
    names = [layer.name for layer in attention_projections(spec).layers]
    fields = (*names, "q_norm", "k_norm") if spec.attention.qk_norm else tuple(names)
    return named(Attention, fields)(spec, key=key, dtype=dtype)


class MLP(eqx.Module):
    """An MLP over a sequence, its projections as its kind says (`mlp_projections`;
    `make_mlp` names its fields): `out(act(up(x)))`, or `out(act(gate(x)) * up(x))` gated,
    without `out` where it has none."""

    mlp: MLPSpec = eqx.field(static=True)
    projections: Projections = eqx.field(static=True)

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, key: PRNGKeyArray, dtype: Any
                 ) -> None:
        self.mlp, self.projections = mlp, mlp_projections(spec, mlp)
        for name, layer in make_projections(self.projections, key=key, dtype=dtype):
            setattr(self, name, layer)

    def __call__(self, x: Array) -> Array:
        p, act = self.projections, activation(self.mlp.activation)
        h = parts(self, p, x)
        h = act(h[0]) * h[1] if self.mlp.gated else act(h[0])
        return h if p.output is None else _tokenwise(getattr(self, p.output), h)


def make_mlp(spec: DecoderSpec, mlp: MLPSpec, *, key: PRNGKeyArray, dtype: Any) -> MLP:
    names = tuple(layer.name for layer in mlp_projections(spec, mlp).layers)
    return named(MLP, names)(spec, mlp, key=key, dtype=dtype)


class Experts(eqx.Module):
    """A mixture's experts (layer kind `experts`): transformers' fused `gate_up_proj`
    `(E, 2 * width, hidden)` (gate rows, then up) and `down_proj` `(E, hidden, width)`, over
    one sequence's tokens `(L, hidden)` and their routing (`zoo.layers.moe`). Per sample under
    `vmap`, the grouping of the sorted dispatch differs from sample to sample, and
    `jax.lax.ragged_dot` has no batching rule for that (jax 0.10): Equinox computes the dense
    reference, `dense_experts` (every expert on every token, equal to the dispatch)."""

    gate_up_proj: Array
    down_proj: Array
    activation: str = eqx.field(static=True)

    def __init__(self, experts: int, hidden: int, width: int, activation: str, *,
                 key: PRNGKeyArray, dtype: Any) -> None:
        k1, k2 = jax.random.split(key)
        b1, b2 = hidden ** -0.5, width ** -0.5
        dt = dtype or jnp.float32
        self.gate_up_proj = jax.random.uniform(k1, (experts, 2 * width, hidden), dt, -b1, b1)
        self.down_proj = jax.random.uniform(k2, (experts, hidden, width), dt, -b2, b2)
        self.activation = activation

    def __call__(self, x: Array, weights: Array, experts: Array) -> Array:
        return dense_experts(x, weights, experts, jnp.swapaxes(self.gate_up_proj, 1, 2),
                             jnp.swapaxes(self.down_proj, 1, 2), activation(self.activation))


canonical.register_class("experts", "eqx", Experts)


class SparseMoE(eqx.Module):
    """A mixture of experts (transformers' sparse MoE block): the router `gate` (a Linear
    without bias, one logit per expert), softmax, top-k routing, the `experts`; `named`
    gives it its two fields in transformers' definition order (`MoESpec.router_first`)."""

    mlp: MLPSpec = eqx.field(static=True)

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, key: PRNGKeyArray, dtype: Any
                 ) -> None:
        k1, k2 = jax.random.split(key)
        e, moe = spec.hidden_size, mlp.moe
        self.gate = Linear(e, moe.experts, use_bias=False, key=k1, dtype=dtype)
        self.experts = Experts(moe.experts, e, mlp.width, mlp.activation, key=k2, dtype=dtype)
        self.mlp = mlp

    def router_logits(self, x: Array) -> Array:
        """The router's logits `(L, experts)`."""
        return _tokenwise(self.gate, x)

    def __call__(self, x: Array) -> Array:
        weights, experts = route(self.router_logits(x), self.mlp.moe.top_k,
                                 self.mlp.moe.normalize)
        return self.experts(x, weights, experts)


def make_moe(spec: DecoderSpec, mlp: MLPSpec, *, key: PRNGKeyArray, dtype: Any) -> SparseMoE:
    fields = ("gate", "experts") if mlp.moe.router_first else ("experts", "gate")
    return named(SparseMoE, fields)(spec, mlp, key=key, dtype=dtype)


class ResidualOutput(eqx.Module):
    """A post-norm branch's end, `LayerNorm(dropout(dense(h)) + x)` (BERT's `BertSelfOutput`,
    `BertOutput`)."""

    dense: Linear
    LayerNorm: eqx.Module
    dropout: eqx.nn.Dropout

    def __init__(self, spec: DecoderSpec, width: int, *, key: PRNGKeyArray, dtype: Any
                 ) -> None:
        self.dense = Linear(width, spec.hidden_size, key=key, dtype=dtype)
        self.LayerNorm = make_norm(spec, spec.hidden_size, dtype)
        self.dropout = eqx.nn.Dropout(spec.residual_dropout)

    def __call__(self, h: Array, x: Array, *, key: Key = None) -> Array:
        return _tokenwise(self.LayerNorm, self.dropout(_tokenwise(self.dense, h), key=key) + x)


MLPS: dict[str, Callable[..., eqx.Module]] = {**dict.fromkeys(MLP_KINDS, make_mlp),
                                              "moe": make_moe}


class Block(eqx.Module):
    """Pre-norm residual block (and the optional post-norms of its branches); `named(Block,
    names)` gives it its modules' fields."""

    residual_dropout: eqx.nn.Dropout
    spec: DecoderSpec = eqx.field(static=True)
    mlp_spec: MLPSpec = eqx.field(static=True)

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, key: PRNGKeyArray, dtype: Any
                 ) -> None:
        k1, k2 = jax.random.split(key)
        e = spec.hidden_size
        norm = lambda: make_norm(spec, e, dtype)
        make = {"attention_norm": norm, "mlp_norm": norm, **dict.fromkeys(POST_ROLES, norm),
                "attention": lambda: make_attention(spec, key=k1, dtype=dtype),
                "mlp": lambda: MLPS[mlp.kind](spec, mlp, key=k2, dtype=dtype)}
        for name, module in nest([(name, make[role]()) for name, role in spec.names.block]):
            setattr(self, name, module)
        self.residual_dropout = eqx.nn.Dropout(spec.residual_dropout)
        self.spec = spec
        self.mlp_spec = mlp

    def part(self, role: str) -> eqx.Module:
        return at(self, self.spec.role(role))

    def post(self, role: str, h: Array) -> Array:
        """`h` through the post-norm `role`, if the block has one."""
        return _tokenwise(self.part(role), h) if self.spec.names.has(role) else h

    def __call__(self, x: Array, positions: Array, mask: Array, inv_freq: np.ndarray | None,
                 kv: KV | None = None, index: Array | int = 0, *, key: Key = None,
                 router: list[Array] | None = None) -> tuple[Array, KV | None]:
        """The block's output and cache; a mixture's router logits appended to `router`."""
        k1, k2, k3 = _keys(key, 3)
        part = self.part
        h, kv = part("attention")(_tokenwise(part("attention_norm"), x), positions, mask,
                                  inv_freq, kv, index, key=k1)
        x = x + self.residual_dropout(self.post("attention_post_norm", h), key=k2)
        normed = _tokenwise(part("mlp_norm"), x)
        if router is not None and self.mlp_spec.kind == "moe":
            router.append(part("mlp").router_logits(normed))
        h = self.post("mlp_post_norm", part("mlp")(normed))
        return x + self.residual_dropout(h, key=k3), kv


class PostNormBlock(eqx.Module):
    """Post-norm residual block (BERT's layer): `attention_output(attention(x), x)`, then
    `mlp_output(mlp(x), x)`; `named(PostNormBlock, names)` gives it its modules' fields."""

    spec: DecoderSpec = eqx.field(static=True)

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec, *, key: PRNGKeyArray, dtype: Any
                 ) -> None:
        k1, k2, k3, k4 = jax.random.split(key, 4)
        q = spec.attention.heads * spec.attention.head_dim
        make = {"attention": lambda: make_attention(spec, key=k1, dtype=dtype),
                "attention_output": lambda: ResidualOutput(spec, q, key=k2, dtype=dtype),
                "mlp": lambda: MLPS[mlp.kind](spec, mlp, key=k3, dtype=dtype),
                "mlp_output": lambda: ResidualOutput(spec, mlp.width, key=k4, dtype=dtype)}
        for name, module in nest([(name, make[role]()) for name, role in spec.names.block]):
            setattr(self, name, module)
        self.spec = spec

    def __call__(self, x: Array, positions: Array, mask: Array, inv_freq: np.ndarray | None,
                 kv: KV | None = None, index: Array | int = 0, *, key: Key = None,
                 router: list[Array] | None = None) -> tuple[Array, KV | None]:
        """The block's output and cache (`router`: a pre-norm block's; no mixture here)."""
        k1, k2, k3 = _keys(key, 3)
        part = lambda role: at(self, self.spec.role(role))
        h, kv = part("attention")(x, positions, mask, inv_freq, kv, index, key=k1)
        x = part("attention_output")(h, x, key=k2)
        return part("mlp_output")(part("mlp")(x), x, key=k3), kv


BLOCKS: dict[str, type[eqx.Module]] = {"pre": Block, "post": PostNormBlock}


def make_block(spec: DecoderSpec, i: int, *, key: PRNGKeyArray, dtype: Any) -> eqx.Module:
    """The block of layer `i` (its MLP: `spec.mlp_of(i)`)."""
    fields = top_names([name for name, _ in spec.names.block])
    return named(BLOCKS[spec.residual], fields)(spec, spec.mlp_of(i), key=key, dtype=dtype)


class Decoder(eqx.Module):
    """Embedding (scaled, learned positions and token types, normed) -> dropout -> blocks
    (each with its layer's window and rotary frequencies) -> final norm (if any);
    `named(Decoder, names)` gives it its modules' fields."""

    embedding_dropout: eqx.nn.Dropout
    spec: DecoderSpec = eqx.field(static=True)

    def __init__(self, spec: DecoderSpec, *, key: PRNGKeyArray, dtype: Any) -> None:
        names, e = spec.names, spec.hidden_size
        k1, k2, *kb = jax.random.split(key, 2 + spec.num_layers)
        k3 = jax.random.fold_in(k2, 1)
        embed = lambda rows, k: eqx.nn.Embedding(rows, e, key=k, dtype=dtype)
        items = [(names.embedding, embed(spec.vocab_size, k1))]
        if names.positions is not None:
            items.append((names.positions, embed(spec.max_positions, k2)))
        if names.token_types is not None:
            items.append((names.token_types, embed(spec.type_vocab_size, k3)))
        if names.embedding_norm is not None:
            items.append((names.embedding_norm, make_norm(spec, e, dtype)))
        items.append((names.layers, tuple(make_block(spec, i, key=k, dtype=dtype)
                                          for i, k in enumerate(kb))))
        if names.norm is not None:
            items.append((names.norm, make_norm(spec, e, dtype)))
        if names.pooler is not None:
            items.append((names.pooler, Linear(e, spec.pooling.size or e,
                                               key=jax.random.fold_in(k2, 2), dtype=dtype)))
        for name, module in nest(items):
            setattr(self, name, module)
        self.embedding_dropout = eqx.nn.Dropout(spec.embedding_dropout)
        self.spec = spec

    def embedding(self) -> eqx.nn.Embedding:
        return at(self, self.spec.names.embedding)

    def pool(self, h: Array, input_ids: Array | None = None) -> Array:
        """The pooled output of one sequence's hidden states `h` `(L, hidden_size)`: the token
        `spec.pooling` says (of `input_ids`), then the pooler and tanh, if any."""
        p = self.spec.pooling
        x = h[p.index(input_ids)]
        if self.spec.names.pooler is None:
            return x
        x = at(self, self.spec.names.pooler)(x)
        return jnp.tanh(x) if p.tanh else x

    def __call__(self, input_ids: Array, attention_mask: Array | None,
                 position_ids: Array | None, cache: KVCache | None, key: Key,
                 token_type_ids: Array | None = None, router: list[Array] | None = None
                 ) -> tuple[Array, list[KV | None]]:
        """The hidden states after the final norm `(L, hidden_size)` and each layer's
        cached keys and values (None without a `cache`); the sparse layers' router logits
        appended to `router`."""
        s, names, length = self.spec, self.spec.names, input_ids.shape[0]
        blocks = at(self, names.layers)
        k_embed, *k_blocks = _keys(key, 1 + len(blocks))
        index = 0 if cache is None else cache.index
        if position_ids is None and s.padding_idx is not None:
            position_ids = padded_positions(input_ids, s.padding_idx)
        positions = index + default_positions(length) if position_ids is None else position_ids
        h = _tokenwise(self.embedding(), input_ids)
        if s.embedding_scale is not None:
            h = h * jnp.asarray(s.embedding_scale, h.dtype)
        if names.token_types is not None:
            types = jnp.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            h = h + _tokenwise(at(self, names.token_types), types)
        if names.positions is not None:
            h = h + _tokenwise(at(self, names.positions), positions)
        if names.embedding_norm is not None:
            h = _tokenwise(at(self, names.embedding_norm), h)
        h = self.embedding_dropout(h, key=k_embed)
        kv_length = None if cache is None else cache.max_length
        masks = {w: sequence_mask(length, attention_mask, w, index, kv_length,
                                  s.attention.causal) for w in s.windows}
        written = []
        for i, (block, k) in enumerate(zip(blocks, k_blocks, strict=True)):
            layer = s.layer(i)
            h, kv = block(h, positions, masks[layer.sliding_window], layer.inv_freq,
                          None if cache is None else cache.layer(i), index, key=k,
                          router=router)
            written.append(kv)
        return (h if names.norm is None else _tokenwise(at(self, names.norm), h)), written


def make_decoder(spec: DecoderSpec, *, key: PRNGKeyArray, dtype: Any) -> Decoder:
    n = spec.names
    paths = [n.embedding, n.positions, n.token_types, n.embedding_norm, n.layers, n.norm,
             n.pooler]
    return named(Decoder, top_names([p for p in paths if p]))(spec, key=key, dtype=dtype)


class CausalLM(eqx.Module):
    """The body and the head, tied (None) or `lm_head`, its logits soft-capped when the spec
    says so; a model declares them as fields by their names (`spec.names.body`, `lm_head`)
    and its `config` (static)."""

    def __init__(self, config: Any, *, key: PRNGKeyArray, dtype: Any = None) -> None:
        dt, spec = dtype_of(dtype), config.decoder
        k1, k2 = jax.random.split(key)
        setattr(self, spec.names.body, make_decoder(spec, key=k1, dtype=dt))
        self.lm_head = (None if spec.tie_word_embeddings else
                        Linear(spec.hidden_size, spec.vocab_size, use_bias=False, key=k2,
                               dtype=dt))
        self.config = config

    def body(self) -> Decoder:
        return getattr(self, self.config.decoder.names.body)

    def encode(self, input_ids: Array, *, attention_mask: Array | None = None,
               position_ids: Array | None = None, key: Key = None) -> Array:
        """The last hidden states `(L, hidden_size)` of one sequence (transformers' base
        model's `last_hidden_state`: the body without the head)."""
        self.config.check_input(input_ids.shape, batched=False)
        return self.body()(input_ids, attention_mask, position_ids, None, key)[0]

    def __call__(self, input_ids: Array, *, attention_mask: Array | None = None,
                 position_ids: Array | None = None, key: Key = None,
                 cache: KVCache | None = None) -> Array | tuple[Array, KVCache]:
        """Logits `(L, vocab)` of one sequence of token ids `(L,)`; `attention_mask` `(L,)`
        (0: padding) and `position_ids` `(L,)` (default `0 .. L-1`) as transformers'.

        With a `cache` (`init_cache`) the tokens take its next slots, `attention_mask`
        `(max_length,)` covers every slot, and the call returns `(logits, cache)`; else with
        the spec's `output_router_logits`, `(logits, router_logits (layers, L, experts))`."""
        self.config.check_input(input_ids.shape, batched=False)
        body, spec = self.body(), self.config.decoder
        router = [] if spec.output_router_logits and cache is None else None
        h, written = body(input_ids, attention_mask, position_ids, cache, key, router=router)
        logits = (contract(h, body.embedding().weight) if self.lm_head is None
                  else _tokenwise(self.lm_head, h))
        logits = softcap(logits, spec.logit_softcap)
        if router is not None:
            return logits, jnp.stack(router)
        return logits if cache is None else (logits, cache.updated(written, len(input_ids)))

    def init_cache(self, max_length: int, dtype: Any = None) -> KVCache:
        """An empty cache of one sequence of up to `max_length` tokens (`dtype`: the
        weights')."""
        spec, a = self.config.decoder, self.config.decoder.attention
        dtype = self.body().embedding().weight.dtype if dtype is None else dtype
        return KVCache.empty(spec.num_layers, max_length, a.kv_heads, a.head_dim, dtype)
