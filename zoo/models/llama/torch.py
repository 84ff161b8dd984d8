"""The Llama family in PyTorch: the reference, with transformers' module names
(`LlamaForCausalLM`, Qwen3's `q_norm` / `k_norm`) and arithmetic, batched `(N, L)` token ids.
A tied head has no module: the logits are `norm(h) @ embed_tokens.weight.T`. Decoding passes a
`KVCache` (`init_cache`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.layers.torch import KVCache, LayerCache, RMSNorm, attend, causal_mask, rotary
from zoo.models.llama.config import LlamaConfig


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        e, d, h, kv = config.hidden_size, config.dim, config.num_attention_heads, config.kv_heads
        self.heads, self.kv_heads, self.head_dim = h, kv, d
        self.q_proj = nn.Linear(e, h * d, bias=config.qkv_biased)
        self.k_proj = nn.Linear(e, kv * d, bias=config.qkv_biased)
        self.v_proj = nn.Linear(e, kv * d, bias=config.qkv_biased)
        self.o_proj = nn.Linear(h * d, e, bias=config.attention_bias)
        self.q_norm = RMSNorm(d, eps=config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(d, eps=config.rms_norm_eps) if config.qk_norm else None

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                rope: object, cache: LayerCache | None = None) -> torch.Tensor:
        n, length, _ = x.shape
        q = self.q_proj(x).view(n, length, self.heads, self.head_dim)
        k = self.k_proj(x).view(n, length, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, length, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = rotary(q.transpose(1, 2), positions, rope)
        k = rotary(k.transpose(1, 2), positions, rope)
        if cache is not None:
            k, v = cache.write(k, v)
        return self.o_proj(attend(q, k, v, mask, self.head_dim ** -0.5))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        e, m, b = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(e, m, bias=b)
        self.up_proj = nn.Linear(e, m, bias=b)
        self.down_proj = nn.Linear(m, e, bias=b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)  # transformers' definition order (its state_dict's)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                rope: object, cache: LayerCache | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, mask, rope, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(config)
                                     for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Model(config)
        self.lm_head = (None if config.tie_word_embeddings
                        else nn.Linear(config.hidden_size, config.vocab_size, bias=False))

    def init_cache(self, batch: int, max_length: int) -> KVCache:
        """An empty cache of `batch` sequences of up to `max_length` tokens."""
        cfg, w = self.config, self.model.embed_tokens.weight
        return KVCache(cfg.num_hidden_layers, batch, max_length, cfg.kv_heads, cfg.dim,
                       w.dtype, w.device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """Logits `(N, L, vocab)` of token ids `(N, L)`; `attention_mask` `(N, L)` (0: padding)
        and `position_ids` `(N, L)` (default `0 .. L-1`) as transformers'. With a `cache`
        (`init_cache`) the tokens take its next slots and `attention_mask` `(N, max_length)`
        covers every slot."""
        self.config.check_input(input_ids.shape)
        m, (n, length) = self.model, input_ids.shape
        index = 0 if cache is None else cache.index
        if position_ids is None:
            position_ids = index + torch.arange(length, device=input_ids.device)[None]
        positions = position_ids.expand(n, length)
        mask = causal_mask(length, attention_mask, self.config.sliding_window, index,
                           None if cache is None else cache.max_length)
        rope = self.config.rope()
        h = m.embed_tokens(input_ids)
        for i, layer in enumerate(m.layers):
            h = layer(h, positions, mask.to(h.device), rope,
                      None if cache is None else cache.layer(i))
        if cache is not None:
            cache.index += length
        h = m.norm(h)
        return h @ m.embed_tokens.weight.T if self.lm_head is None else self.lm_head(h)
