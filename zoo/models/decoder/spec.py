"""What a decoder-only language model declares to the shared body: transformers' module names
(`Names`) and the options of its layers (`DecoderSpec`). No library is imported here.

The body is embedding (times `embedding_scale`, if any, + token types + learned positions,
then the embedding norm, if any) -> dropout -> blocks -> final norm (if any) -> head (tied to
the embedding or `lm_head`; its logits soft-capped, `cap * tanh(x / cap)`, with
`logit_softcap`). A block's modules play roles (`ROLES`, and the
optional `POST_ROLES`): `attention_norm`, `attention`, `mlp_norm`, `mlp`; a block computes
`x + attention_post_norm(attention(attention_norm(x)))`, then
`x + mlp_post_norm(mlp(mlp_norm(x)))` (an absent post-norm: the identity), each branch
followed by the residual dropout. A post-norm block (BERT's, `residual` "post") plays the
roles `POST_NORM_ROLES`: `x = attention_output(attention(x), x)`, then
`x = mlp_output(mlp(x), x)`, each output `norm(x + dropout(dense(h)))`. Names are dotted
paths where transformers nests its modules (`attention.self`, `embeddings.word_embeddings`):
each library creates the containers on the way. Each kind of layer is one entry of a table
per library, chosen by the spec's kind:

- norm (`norm`): `layer_norm` (weight and bias), `rms_norm` (transformers' `LlamaRMSNorm`) or
  `offset_rms_norm` (transformers' `GemmaRMSNorm`: times `1 + weight`, in float32);
- attention (`AttentionSpec.layout`) and MLP (`MLPSpec.kind`): their projections, the table
  `LAYOUTS` (`projections`: names and roles in transformers' definition order, sizes and biases
  from the spec, `Conv1D` for GPT-2's `c_attn` and `c_fc`, always biased). Queries, keys and
  values come from `q`, `k`, `v` or one fused `qkv` output (GPT-2's `c_attn`, Phi-3's
  `qkv_proj`) split by `qkv_sizes`, optionally per-head `q_norm` / `k_norm` (`qk_norm`), then
  the `out` projection (none for BERT's: the block's `attention_output`); causal, or
  bidirectional with `causal=False` (only the padding masked); grouped key/value heads, a
  sliding window, the scores' `scale` (default `head_dim ** -0.5`) and soft-capping
  (`logit_softcap`). An MLP is `out(act(up(x)))`, or `out(act(gate(x)) * up(x))` when gated
  (`gated`; Phi-3's `gate_up_proj`: one fused output, gate first), without `out` for BERT's
  intermediate (its second matrix: the block's `mlp_output`); `moe` is a mixture of gated
  experts (`MoESpec`: the router `gate`, a Linear without bias, and `experts`, transformers'
  fused `gate_up_proj` / `down_proj` stacked on an expert axis); layers may differ in their MLP
  (`layer_mlps`, one `MLPSpec` per layer: Qwen3-MoE's dense layers among sparse ones). With
  `output_router_logits` a model returns `(logits, router_logits)`, the sparse layers' router
  logits `(N, layers, L, experts)` (`zoo.layers.moe.load_balancing_loss`);
- residual (`DecoderSpec.residual`, from the roles): `pre` (norm, branch, add) or `post`
  (branch, add, norm);
- positions: learned absolute (`Names.positions`, `max_positions` rows; counted from
  `padding_idx + 1` over the non-padding tokens when `padding_idx` is set, RoBERTa's) or
  rotary (`rope`, the inverse frequencies: `2 * len(rope)` leading dimensions of each head
  rotated, the rest passed through, transformers' partial rotary), or both absent; token type
  embeddings (`Names.token_types`, `type_vocab_size` rows) and an embedding norm
  (`Names.embedding_norm`) where the names have them;
- pooling (the body's `pool`, `PoolSpec`): one token's state (`first`: BERT's; `last`:
  SigLIP's text tower; `eos`: the first `eos_token_id`, CLIP's; `max_id`: the highest id,
  CLIP's rule for its configs of `eos_token_id` 2), then the pooler where the names have one
  (`Names.pooler`: a Linear, then tanh when `PoolSpec.tanh`: BERT's `tanh(dense(h[0]))`,
  SigLIP's `head`);
- layer types: layers may differ in their window and rotary frequencies (`layer_types`, one
  name per layer, each an entry of the table `attention_types`: a `LayerAttention`); without
  them every layer has the attention's `sliding_window` and the spec's `rope`.

A new family adds its names and, where its arithmetic is new, a kind to these tables (e.g. a
norm with `(1 + weight)`, a fused `qkv_proj`, a mixture of experts), never a branch on the
family.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

ROLES = ("attention_norm", "attention", "mlp_norm", "mlp")
POST_ROLES = ("attention_post_norm", "mlp_post_norm")  # optional: norms of a branch's output
# A post-norm block's roles: each `*_output` holds `dense` and the norm
POST_NORM_ROLES = ("attention", "attention_output", "mlp", "mlp_output")


@dataclass(frozen=True)
class Names:
    """transformers' module names: the body's (`body.embedding`, `body.layers.0`, ...), each
    block's as `(name, role)` pairs in transformers' definition order (its `state_dict`'s)."""

    body: str  # "transformer" (GPT-2), "model" (Llama), "bert"
    embedding: str
    layers: str
    norm: str | None  # the final norm (None: none, BERT's)
    block: tuple[tuple[str, str], ...]
    positions: str | None = None  # learned absolute position embedding
    token_types: str | None = None  # token type embedding (BERT's segments)
    embedding_norm: str | None = None  # the norm of the summed embeddings
    pooler: str | None = None  # a Linear of the pooled token's state (`PoolSpec`)

    def __post_init__(self) -> None:
        roles = sorted(role for _, role in self.block if role not in POST_ROLES)
        post = [role for _, role in self.block if role in POST_ROLES]
        if (roles not in (sorted(ROLES), sorted(POST_NORM_ROLES)) or len(set(post)) != len(post)
                or (post and roles != sorted(ROLES))):
            raise ValueError(f"a block needs one module per role {ROLES} (and at most one per "
                             f"optional role {POST_ROLES}) or per role {POST_NORM_ROLES}, "
                             f"found {roles + post}")

    @property
    def residual(self) -> str:
        """The residual its block's roles make: `pre` (ROLES) or `post` (POST_NORM_ROLES)."""
        return "post" if self.has("attention_output") else "pre"

    def has(self, role: str) -> bool:
        """Whether a block has a module playing `role` (the optional post-norms)."""
        return any(r == role for _, r in self.block)


@dataclass(frozen=True)
class AttentionSpec:
    """The attention's layout and options (`c_attn`: transformers' `Conv1D`, always biased;
    `qkvo` and `qkv_proj`: biases as `qkv_bias` and `out_bias`)."""

    layout: Literal["c_attn", "qkvo", "qkv_proj", "query_key_value", "out_proj"]
    heads: int
    kv_heads: int
    head_dim: int
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norm: bool = False  # per-head norms of queries and keys, before the rotary embedding
    sliding_window: int | None = None
    dropout: float = 0.0  # on the attention weights, in training
    scale: float | None = None  # the scores' factor (None: head_dim ** -0.5)
    logit_softcap: float | None = None  # scores soft-capped, `cap * tanh(s / cap)`
    causal: bool = True  # False: every token sees every other (but the padding)

    @property
    def scaling(self) -> float:
        return self.head_dim ** -0.5 if self.scale is None else self.scale

    @property
    def qkv_sizes(self) -> tuple[int, int, int]:
        """The widths of the queries, keys and values (`qkv_proj` stacks them in this order)."""
        kv = self.kv_heads * self.head_dim
        return self.heads * self.head_dim, kv, kv


@dataclass(frozen=True)
class MoESpec:
    """A mixture of experts: `experts` gated MLPs, each token sent to its `top_k` most probable
    (router softmax), their outputs summed with the top-k probabilities, renormalised to sum 1
    when `normalize`. `dispatch`: `sorted` (tokens grouped by expert, one grouped matmul) or
    `dense` (every expert on every token: the reference); `router_first`: the router `gate`
    defined before `experts` (transformers' definition order)."""

    experts: int
    top_k: int
    normalize: bool = True
    dispatch: Literal["sorted", "dense"] = "sorted"
    router_first: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.experts:
            raise ValueError(f"a mixture of {self.experts} experts routes each token to 1 .. "
                             f"{self.experts} of them, found top_k {self.top_k}")


@dataclass(frozen=True)
class MLPSpec:
    """The MLP's kind, width and activation (`c_fc`: `Conv1D`, always biased; `gated` and
    `gate_up`: biases as `bias`; `moe`: `moe` says the mixture, `width` is each expert's)."""

    kind: Literal["c_fc", "gated", "gate_up", "dense", "fc", "moe"]
    width: int
    activation: str
    bias: bool = False
    moe: MoESpec | None = None

    def __post_init__(self) -> None:
        if (self.kind == "moe") != (self.moe is not None):
            raise ValueError(f"an MLP of kind {self.kind!r} needs moe set exactly when its kind "
                             "is 'moe'")

    @property
    def gated(self) -> bool:
        """Whether a gate multiplies the up projection (three `width`-wide matrices, else two)."""
        return self.kind in ("gated", "gate_up", "moe")


@dataclass(frozen=True)
class PoolSpec:
    """How the body's `pool` makes one vector of a sequence: the state of one token (`first`,
    `last`, `eos`: the first `eos_token_id`, `max_id`: the highest id, as transformers' CLIP
    pools), then the pooler (`Names.pooler`, if any: a Linear of `size` outputs, None: the
    hidden size), then tanh when `tanh`."""

    token: Literal["first", "last", "eos", "max_id"] = "first"
    eos_token_id: int | None = None
    size: int | None = None
    tanh: bool = True

    def __post_init__(self) -> None:
        if (self.token == "eos") != (self.eos_token_id is not None):
            raise ValueError(f"pooling at token {self.token!r} needs eos_token_id exactly when "
                             f"the token is 'eos', found {self.eos_token_id!r}")

    def index(self, input_ids: Any) -> Any:
        """The pooled token's index along the last axis of `input_ids` (NumPy, JAX and
        PyTorch arrays alike; an int for `first` and `last`)."""
        if self.token in ("first", "last"):
            return 0 if self.token == "first" else -1
        if input_ids is None:
            raise ValueError(f"pooling at token {self.token!r} reads the token ids: pass "
                             "input_ids")
        if self.token == "max_id":
            return input_ids.argmax(-1)
        return ((input_ids == self.eos_token_id) * 1).argmax(-1)


@dataclass(frozen=True)
class LayerAttention:
    """What one type of layer's attention has of its own: a sliding window (None: all
    tokens) and rotary inverse frequencies (float32 values; None: no rotary embedding)."""

    sliding_window: int | None = None
    rope: tuple[float, ...] | None = None

    @property
    def inv_freq(self) -> np.ndarray | None:
        """The rotary inverse frequencies `(rotated dims / 2,)` float32, or None."""
        return None if self.rope is None else np.asarray(self.rope, np.float32)


@dataclass(frozen=True)
class DecoderSpec:
    """Everything the body of a family needs from its config (a config's `decoder`)."""

    names: Names
    vocab_size: int
    hidden_size: int
    num_layers: int
    norm: Literal["layer_norm", "rms_norm", "offset_rms_norm"]
    norm_eps: float
    attention: AttentionSpec
    mlp: MLPSpec
    max_positions: int | None = None  # rows of the learned position embedding
    rope: tuple[float, ...] | None = None  # rotary inverse frequencies (float32 values)
    embedding_dropout: float = 0.0
    residual_dropout: float = 0.0  # after each block's attention and MLP
    tie_word_embeddings: bool = False
    embedding_scale: float | None = None  # the embeddings' factor, cast to their dtype
    logit_softcap: float | None = None  # the head's logits soft-capped, `cap * tanh(x / cap)`
    layer_types: tuple[str, ...] | None = None  # per layer, a name of `attention_types`
    attention_types: tuple[tuple[str, LayerAttention], ...] = ()
    layer_mlps: tuple[MLPSpec, ...] | None = None  # per layer (None: `mlp` in every layer)
    output_router_logits: bool = False  # the output is (logits, router logits)
    type_vocab_size: int | None = None  # rows of the token type embedding
    padding_idx: int | None = None  # positions counted from padding_idx + 1 (RoBERTa)
    pooling: PoolSpec = PoolSpec()  # the body's `pool`: which token, the pooler's options

    def __post_init__(self) -> None:
        if (self.names.token_types is None) != (self.type_vocab_size is None):
            raise ValueError("token types need both a name (Names.token_types) and "
                             f"type_vocab_size, found {self.names.token_types!r} and "
                             f"{self.type_vocab_size!r}")
        if self.layer_mlps is not None and len(self.layer_mlps) != self.num_layers:
            raise ValueError(f"layer_mlps needs one MLPSpec per layer ({self.num_layers}), "
                             f"found {len(self.layer_mlps)}")
        if self.output_router_logits and not self.sparse_layers:
            raise ValueError("output_router_logits needs a layer whose MLP is a mixture of "
                             "experts (kind 'moe')")
        if self.layer_types is None:
            return
        known = dict(self.attention_types)
        unknown = sorted(set(self.layer_types) - set(known))
        if len(self.layer_types) != self.num_layers or unknown:
            raise ValueError(f"layer_types needs one of {sorted(known)} per layer "
                             f"({self.num_layers}), found {list(self.layer_types)}")

    @property
    def inv_freq(self) -> np.ndarray | None:
        """The rotary inverse frequencies `(rotated dims / 2,)` float32, or None."""
        return None if self.rope is None else np.asarray(self.rope, np.float32)

    def mlp_of(self, i: int) -> MLPSpec:
        """The MLP of layer `i`."""
        return self.mlp if self.layer_mlps is None else self.layer_mlps[i]

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        """The layers whose MLP is a mixture of experts (their router logits are output)."""
        return tuple(i for i in range(self.num_layers) if self.mlp_of(i).kind == "moe")

    def layer(self, i: int) -> LayerAttention:
        """The window and rotary frequencies of layer `i`."""
        if self.layer_types is None:
            return LayerAttention(self.attention.sliding_window, self.rope)
        return dict(self.attention_types)[self.layer_types[i]]

    @property
    def windows(self) -> tuple[int | None, ...]:
        """The distinct sliding windows of the layers (each needs its own mask)."""
        return tuple(dict.fromkeys(self.layer(i).sliding_window
                                   for i in range(self.num_layers)))

    @property
    def residual(self) -> str:
        """`pre` or `post`, as the block's roles say (`Names.residual`)."""
        return self.names.residual

    def role(self, role: str) -> str:
        """The name of the block's module playing `role`."""
        return next(name for name, r in self.names.block if r == role)


# Each attention layout's and MLP kind's projections, `(name, role)` in transformers' definition
# order (its `state_dict`'s); its kind names transformers' `Conv1D` layers (`CONV1D`).
LAYOUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "c_attn": (("c_attn", "qkv"), ("c_proj", "out")),  # GPT-2's
    "qkvo": (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("o_proj", "out")),
    "qkv_proj": (("o_proj", "out"), ("qkv_proj", "qkv")),  # Phi-3's
    "query_key_value": (("query", "q"), ("key", "k"), ("value", "v")),  # BERT's
    "out_proj": (("k_proj", "k"), ("v_proj", "v"), ("q_proj", "q"), ("out_proj", "out")),
    "c_fc": (("c_fc", "up"), ("c_proj", "out")),  # GPT-2's
    "gated": (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "out")),
    "gate_up": (("gate_up_proj", "gate_up"), ("down_proj", "out")),  # Phi-3's, gate first
    "dense": (("dense", "up"),),  # BERT's intermediate
    "fc": (("fc1", "up"), ("fc2", "out")),  # CLIP's and SigLIP's
}
CONV1D = ("c_attn", "c_fc")
MLP_KINDS = ("c_fc", "gated", "gate_up", "dense", "fc")  # and "moe", a mixture of experts


@dataclass(frozen=True)
class Projection:
    """One projection: transformers' name, its role, sizes, bias and whether it is a `Conv1D`
    (weight `(in, out)`), else a linear layer."""

    name: str
    role: str
    inputs: int
    outputs: int
    bias: bool
    conv1d: bool


@dataclass(frozen=True)
class Projections:
    """A layer's projections in definition order (`layers`); `parts`: the names whose outputs
    are the parts (queries, keys, values; gate and up; up), one each or one fused output split
    at `splits`; `output`: the output projection's name (None: none)."""

    layers: tuple[Projection, ...]
    parts: tuple[str, ...]
    splits: tuple[int, ...]
    output: str | None


def _projections(kind: str, order: tuple[str, ...], sizes: dict[str, tuple[int, int, bool]],
                 part_sizes: tuple[int, ...]) -> Projections:
    """`LAYOUTS[kind]`, its roles' `(inputs, outputs, bias)` from `sizes`, its parts taken in
    the roles' `order`, a fused output split into `part_sizes`."""
    conv = kind in CONV1D
    layers = tuple(Projection(name, role, *sizes[role][:2], sizes[role][2] or conv, conv)
                   for name, role in LAYOUTS[kind])
    names = tuple(p.name for r in order for p in layers if p.role == r)
    fused = len(names) < len(part_sizes)
    splits = tuple(np.cumsum(part_sizes[:-1]).tolist()) if fused else ()
    return Projections(layers, names, splits,
                       next((p.name for p in layers if p.role == "out"), None))


@functools.cache
def attention_projections(spec: DecoderSpec) -> Projections:
    """The attention's projections (`LAYOUTS[spec.attention.layout]`)."""
    a, e = spec.attention, spec.hidden_size
    q, kv, _ = a.qkv_sizes
    sizes = {"q": (e, q, a.qkv_bias), "k": (e, kv, a.qkv_bias), "v": (e, kv, a.qkv_bias),
             "qkv": (e, sum(a.qkv_sizes), a.qkv_bias), "out": (q, e, a.out_bias)}
    return _projections(a.layout, ("qkv", "q", "k", "v"), sizes, a.qkv_sizes)


@functools.cache
def mlp_projections(spec: DecoderSpec, mlp: MLPSpec) -> Projections:
    """The projections of an MLP (not a mixture: `LAYOUTS[mlp.kind]`)."""
    e, m, b = spec.hidden_size, mlp.width, mlp.bias
    sizes = {"gate": (e, m, b), "up": (e, m, b), "gate_up": (e, 2 * m, b), "out": (m, e, b)}
    return _projections(mlp.kind, ("gate_up", "gate", "up"), sizes,
                        (m, m) if mlp.gated else (m,))


def padded_positions(input_ids: Any, padding_idx: int) -> Any:
    """RoBERTa's position ids (transformers' `create_position_ids_from_input_ids`): the tokens
    but `padding_idx` counted from `padding_idx + 1`, the padding at `padding_idx`. Works on
    NumPy, JAX and PyTorch arrays alike."""
    token = input_ids != padding_idx
    return token.cumsum(-1) * token + padding_idx
