"""The decoder body in PyTorch, the reference: transformers' module names (as the spec's
`Names` say) and arithmetic, batched `(N, L)` token ids. A tied head has no module: the logits
are `norm(h) @ embedding.weight.T`, so `state_dict()` holds the shared array once. Decoding
passes a `KVCache` (`init_cache`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import canonical
from zoo.layers.torch import (
    Conv1D,
    KVCache,
    LayerCache,
    OffsetRMSNorm,
    RMSNorm,
    attend,
    causal_mask,
    rotary,
    softcap,
)
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


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """transformers' `NewGELUActivation` (GPT-2's `gelu_new`), written as it writes it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                       * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_new": gelu_new, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu, "relu": F.relu, "silu": F.silu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x)}
NORMS: dict[str, type[nn.Module]] = {"layer_norm": nn.LayerNorm, "rms_norm": RMSNorm,
                                     "offset_rms_norm": OffsetRMSNorm}


def make_norm(spec: DecoderSpec, size: int) -> nn.Module:
    return NORMS[spec.norm](size, eps=spec.norm_eps)


class Container(nn.Module):
    """A plain node of transformers' nesting (the `attention` of `attention.self`)."""


def place(owner: nn.Module, path: str, module: nn.Module) -> None:
    """`module` registered at the dotted `path` under `owner`, `Container`s created on the
    way (transformers' `attention.self`, `embeddings.word_embeddings`)."""
    *parents, name = path.split(".")
    for part in parents:
        if part not in owner._modules:
            owner.add_module(part, Container())
        owner = owner.get_submodule(part)
    owner.add_module(name, module)


def make_projections(p: Projections) -> list[tuple[str, nn.Module]]:
    """`p`'s layers, in definition order (`Conv1D` or `nn.Linear`)."""
    return [(layer.name, Conv1D(layer.outputs, layer.inputs) if layer.conv1d else
             nn.Linear(layer.inputs, layer.outputs, bias=layer.bias)) for layer in p.layers]


def parts(module: nn.Module, p: Projections, x: torch.Tensor) -> list[torch.Tensor]:
    """The parts of `x`: one per projection, or one projection's output split (views)."""
    outs = [getattr(module, name)(x) for name in p.parts]
    return outs if not p.splits else list(outs[0].tensor_split(p.splits, dim=-1))


class Attention(nn.Module):
    """Self-attention (transformers' eager attention), its projections as the spec's layout
    says (`attention_projections`): grouped key/value heads, per-head `q_norm` / `k_norm` with
    `qk_norm`, rotary positions with the layer's inverse frequencies `inv_freq` when it has
    them, the spec's scale and soft-capping."""

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        a, self.spec, self.projections = spec.attention, spec, attention_projections(spec)
        self.dropout = nn.Dropout(a.dropout)
        for name, layer in make_projections(self.projections):
            self.add_module(name, layer)
        if a.qk_norm:
            self.q_norm, self.k_norm = make_norm(spec, a.head_dim), make_norm(spec, a.head_dim)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                inv_freq: np.ndarray | None, cache: LayerCache | None = None) -> torch.Tensor:
        a, p, (n, length, _) = self.spec.attention, self.projections, x.shape
        q, k, v = (t.view(n, length, -1, a.head_dim) for t in parts(self, p, x))
        if a.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (N, heads, L, D)
        if inv_freq is not None:
            q, k = rotary(q, positions, inv_freq), rotary(k, positions, inv_freq)
        if cache is not None:
            k, v = cache.write(k, v)
        out = attend(q, k, v, mask, a.scaling, self.dropout, a.logit_softcap)
        return out if p.output is None else getattr(self, p.output)(out)


class MLP(nn.Module):
    """An MLP, its projections as its kind says (`mlp_projections`): `out(act(up(x)))`, or
    `out(act(gate(x)) * up(x))` gated, without `out` where it has none."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec) -> None:
        super().__init__()
        self.gated, self.projections = mlp.gated, mlp_projections(spec, mlp)
        for name, layer in make_projections(self.projections):
            self.add_module(name, layer)
        self.act = ACTIVATIONS[mlp.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p, h = self.projections, parts(self, self.projections, x)
        h = self.act(h[0]) * h[1] if self.gated else self.act(h[0])
        return h if p.output is None else getattr(self, p.output)(h)


class Experts(nn.Module):
    """transformers' fused experts (`MixtralExperts`, layer kind `experts`): `gate_up_proj`
    `(E, 2 * width, hidden)` (gate rows, then up) and `down_proj` `(E, hidden, width)`; each
    expert's gated MLP on the tokens routed to it, weighted and added back, as transformers
    computes it."""

    def __init__(self, experts: int, hidden: int, width: int, activation: str) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * width, hidden))
        self.down_proj = nn.Parameter(torch.empty(experts, hidden, width))
        for w in (self.gate_up_proj, self.down_proj):
            bound = w.shape[-1] ** -0.5
            nn.init.uniform_(w, -bound, bound)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
                ) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in torch.unique(experts).tolist():
            token, choice = torch.where(experts == e)
            gate, up = F.linear(x[token], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(self.act(gate) * up, self.down_proj[e])
            out.index_add_(0, token, (y * weights[token, choice, None]).to(out.dtype))
        return out


canonical.register_class("experts", "torch", Experts)


class SparseMoE(nn.Module):
    """transformers' sparse MoE block: the router `gate` (a Linear without bias, one logit
    per expert), softmax in float32, top-k (renormalised to sum 1 when the spec says so), the
    `experts`, defined in transformers' order (`MoESpec.router_first`)."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec) -> None:
        super().__init__()
        e, m = spec.hidden_size, mlp.moe
        make = {"gate": lambda: nn.Linear(e, m.experts, bias=False),
                "experts": lambda: Experts(m.experts, e, mlp.width, mlp.activation)}
        for name in ("gate", "experts") if m.router_first else ("experts", "gate"):
            self.add_module(name, make[name]())
        self.moe = m

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The router's logits `(N, L, experts)`."""
        return self.gate(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.gate(flat).float(), dim=-1)
        weights, experts = torch.topk(probs, self.moe.top_k, dim=-1)
        if self.moe.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.experts(flat, experts, weights).reshape(x.shape)


class ResidualOutput(nn.Module):
    """A post-norm branch's end, `LayerNorm(dropout(dense(h)) + x)` (BERT's `BertSelfOutput`,
    `BertOutput`)."""

    def __init__(self, spec: DecoderSpec, width: int) -> None:
        super().__init__()
        self.dense = nn.Linear(width, spec.hidden_size)
        self.LayerNorm = make_norm(spec, spec.hidden_size)
        self.dropout = nn.Dropout(spec.residual_dropout)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + x)


MLPS: dict[str, type[nn.Module]] = {**dict.fromkeys(MLP_KINDS, MLP), "moe": SparseMoE}


class Block(nn.Module):
    """Pre-norm residual block (and the optional post-norms of its branches): its modules are
    named and ordered by `spec.names.block`."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec) -> None:
        super().__init__()
        norm = lambda: make_norm(spec, spec.hidden_size)
        make = {"attention_norm": norm, "mlp_norm": norm, **dict.fromkeys(POST_ROLES, norm),
                "attention": lambda: Attention(spec),
                "mlp": lambda: MLPS[mlp.kind](spec, mlp)}
        for name, role in spec.names.block:  # transformers' definition order
            place(self, name, make[role]())
        self.spec = spec
        self.sparse = mlp.kind == "moe"
        self.residual_dropout = nn.Dropout(spec.residual_dropout)

    def part(self, role: str) -> nn.Module:
        return self.get_submodule(self.spec.role(role))

    def post(self, role: str, h: torch.Tensor) -> torch.Tensor:
        """`h` through the post-norm `role`, if the block has one."""
        return self.part(role)(h) if self.spec.names.has(role) else h

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                inv_freq: np.ndarray | None, cache: LayerCache | None = None,
                router: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The block's output; a mixture's router logits appended to `router`."""
        part = self.part
        h = part("attention")(part("attention_norm")(x), positions, mask, inv_freq, cache)
        x = x + self.residual_dropout(self.post("attention_post_norm", h))
        normed = part("mlp_norm")(x)
        if router is not None and self.sparse:
            router.append(part("mlp").router_logits(normed))
        h = self.post("mlp_post_norm", part("mlp")(normed))
        return x + self.residual_dropout(h)


class PostNormBlock(nn.Module):
    """Post-norm residual block (BERT's layer): `attention_output(attention(x), x)`, then
    `mlp_output(mlp(x), x)`; its modules are named and ordered by `spec.names.block`."""

    def __init__(self, spec: DecoderSpec, mlp: MLPSpec) -> None:
        super().__init__()
        q = spec.attention.heads * spec.attention.head_dim
        make = {"attention": lambda: Attention(spec),
                "attention_output": lambda: ResidualOutput(spec, q),
                "mlp": lambda: MLPS[mlp.kind](spec, mlp),
                "mlp_output": lambda: ResidualOutput(spec, mlp.width)}
        for name, role in spec.names.block:
            place(self, name, make[role]())
        self.spec = spec

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                inv_freq: np.ndarray | None, cache: LayerCache | None = None,
                router: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The block's output (`router`: a pre-norm block's; no mixture here)."""
        part = lambda role: self.get_submodule(self.spec.role(role))
        x = part("attention_output")(part("attention")(x, positions, mask, inv_freq, cache), x)
        return part("mlp_output")(part("mlp")(x), x)


BLOCKS: dict[str, type[nn.Module]] = {"pre": Block, "post": PostNormBlock}


class Decoder(nn.Module):
    """Embedding (scaled, learned positions and token types, normed) -> dropout -> blocks
    (each with its layer's window and rotary frequencies) -> final norm (if any)."""

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        names, e = spec.names, spec.hidden_size
        place(self, names.embedding, nn.Embedding(spec.vocab_size, e))
        if names.positions is not None:
            place(self, names.positions, nn.Embedding(spec.max_positions, e))
        if names.token_types is not None:
            place(self, names.token_types, nn.Embedding(spec.type_vocab_size, e))
        if names.embedding_norm is not None:
            place(self, names.embedding_norm, make_norm(spec, e))
        self.embedding_dropout = nn.Dropout(spec.embedding_dropout)
        place(self, names.layers, nn.ModuleList([BLOCKS[spec.residual](spec, spec.mlp_of(i))
                                                 for i in range(spec.num_layers)]))
        if names.norm is not None:
            place(self, names.norm, make_norm(spec, e))
        if names.pooler is not None:
            place(self, names.pooler, nn.Linear(e, spec.pooling.size or e))
        self.spec = spec

    def pool(self, h: torch.Tensor, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The pooled output `(N, ...)` of the hidden states `h` `(N, L, hidden_size)`: the
        token `spec.pooling` says (of `input_ids`), then the pooler and tanh, if any."""
        p = self.spec.pooling
        x = h[torch.arange(h.shape[0], device=h.device), p.index(input_ids)]
        if self.spec.names.pooler is None:
            return x
        x = self.get_submodule(self.spec.names.pooler)(x)
        return torch.tanh(x) if p.tanh else x

    def embedding(self) -> nn.Embedding:
        return self.get_submodule(self.spec.names.embedding)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None, cache: KVCache | None,
                token_type_ids: torch.Tensor | None = None,
                router: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The hidden states after the final norm, `(N, L, hidden_size)`; the sparse layers'
        router logits appended to `router`."""
        s, names, (n, length) = self.spec, self.spec.names, input_ids.shape
        index = 0 if cache is None else cache.index
        if position_ids is None and s.padding_idx is not None:
            position_ids = padded_positions(input_ids, s.padding_idx)
        if position_ids is None:
            position_ids = index + torch.arange(length, device=input_ids.device)[None]
        positions = position_ids.expand(n, length)
        h = self.embedding()(input_ids)
        if s.embedding_scale is not None:
            h = h * torch.tensor(s.embedding_scale, dtype=h.dtype)
        if names.token_types is not None:
            types = (torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids)
            h = h + self.get_submodule(names.token_types)(types)
        if names.positions is not None:
            h = h + self.get_submodule(names.positions)(positions)
        if names.embedding_norm is not None:
            h = self.get_submodule(names.embedding_norm)(h)
        h = self.embedding_dropout(h)
        kv_length = None if cache is None else cache.max_length
        masks = {w: causal_mask(length, attention_mask, w, index, kv_length,
                                s.attention.causal).to(h.device) for w in s.windows}
        for i, block in enumerate(self.get_submodule(names.layers)):
            layer = s.layer(i)
            h = block(h, positions, masks[layer.sliding_window], layer.inv_freq,
                      None if cache is None else cache.layer(i), router)
        if cache is not None:
            cache.index += length
        return h if names.norm is None else self.get_submodule(names.norm)(h)


class CausalLM(nn.Module):
    """The body (`spec.names.body`) and the head, tied (no module) or `lm_head`, its logits
    soft-capped when the spec says so."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        spec = config.decoder
        self.config = config
        self.add_module(spec.names.body, Decoder(spec))
        self.lm_head = (None if spec.tie_word_embeddings
                        else nn.Linear(spec.hidden_size, spec.vocab_size, bias=False))

    def body(self) -> Decoder:
        return self.get_submodule(self.config.decoder.names.body)

    def init_cache(self, batch: int, max_length: int) -> KVCache:
        """An empty cache of `batch` sequences of up to `max_length` tokens."""
        spec, w = self.config.decoder, self.body().embedding().weight
        a = spec.attention
        return KVCache(spec.num_layers, batch, max_length, a.kv_heads, a.head_dim, w.dtype,
                       w.device)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The last hidden states `(N, L, hidden_size)` (transformers' base model's)."""
        self.config.check_input(input_ids.shape)
        return self.body()(input_ids, attention_mask, position_ids, None)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """Logits `(N, L, vocab)` of token ids `(N, L)`; `attention_mask` `(N, L)` (0: padding)
        and `position_ids` `(N, L)` (default `0 .. L-1`) as transformers'. With a `cache`
        (`init_cache`) the tokens take its next slots and `attention_mask` `(N, max_length)`
        covers every slot. With the spec's `output_router_logits` (and no cache),
        `(logits, router_logits (N, layers, L, experts))`."""
        self.config.check_input(input_ids.shape)
        body, spec = self.body(), self.config.decoder
        router = [] if spec.output_router_logits and cache is None else None
        h = body(input_ids, attention_mask, position_ids, cache, router=router)
        logits = h @ body.embedding().weight.T if self.lm_head is None else self.lm_head(h)
        logits = softcap(logits, spec.logit_softcap)
        return logits if router is None else (logits, torch.stack(router, dim=1))
