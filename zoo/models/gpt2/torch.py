"""GPT-2 in PyTorch: the reference, with transformers' module names (`GPT2LMHeadModel`) and its
arithmetic, batched `(N, L)` token ids. The tied head has no module: the logits are
`ln_f(h) @ wte.weight.T`, so `state_dict()` holds the shared array once (`lm_head` exists
only when untied). Decoding passes a `KVCache` (`init_cache`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zoo.layers.torch import Conv1D, KVCache, LayerCache, attend, causal_mask
from zoo.models.gpt2.config import GPT2Config


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """transformers' `NewGELUActivation` (GPT-2's `gelu_new`), written as it writes it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                       * (x + 0.044715 * torch.pow(x, 3.0))))


_ACTIVATIONS = {"gelu_new": gelu_new,
                "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
                "gelu": F.gelu, "relu": F.relu}


class Attention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.num_heads, self.width = config.n_head, config.n_embd
        self.c_attn = Conv1D(3 * config.n_embd, config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:
        n, length, _ = x.shape
        q, k, v = (t.view(n, length, self.num_heads, -1).transpose(1, 2)
                   for t in self.c_attn(x).split(self.width, dim=2))
        if cache is not None:
            k, v = cache.write(k, v)
        out = attend(q, k, v, mask, q.shape[-1] ** -0.5, self.attn_dropout)
        return self.resid_dropout(self.c_proj(out))


class MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.c_fc = Conv1D(config.inner, config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.inner)
        self.act = _ACTIVATIONS[config.activation_function]
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = Attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask, cache)
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.transformer = Transformer(config)
        self.lm_head = (None if config.tie_word_embeddings
                        else nn.Linear(config.n_embd, config.vocab_size, bias=False))

    def init_cache(self, batch: int, max_length: int) -> KVCache:
        """An empty cache of `batch` sequences of up to `max_length` tokens."""
        cfg, w = self.config, self.transformer.wte.weight
        return KVCache(cfg.n_layer, batch, max_length, cfg.n_head, cfg.head_dim, w.dtype,
                       w.device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """Logits `(N, L, vocab)` of token ids `(N, L)`; `attention_mask` `(N, L)` (0: padding)
        and `position_ids` `(N, L)` (default `0 .. L-1`) as transformers'. With a `cache`
        (`init_cache`) the tokens take its next slots and `attention_mask` `(N, max_length)`
        covers every slot."""
        self.config.check_input(input_ids.shape)
        t = self.transformer
        length = input_ids.shape[1]
        index = 0 if cache is None else cache.index
        if position_ids is None:
            position_ids = index + torch.arange(length, device=input_ids.device)[None]
        h = t.drop(t.wte(input_ids) + t.wpe(position_ids))
        mask = causal_mask(length, attention_mask, None, index,
                           None if cache is None else cache.max_length).to(h.device)
        for i, block in enumerate(t.h):
            h = block(h, mask, None if cache is None else cache.layer(i))
        if cache is not None:
            cache.index += length
        h = t.ln_f(h)
        return h @ t.wte.weight.T if self.lm_head is None else self.lm_head(h)
