"""PyTorch layers of the zoo's reference models for language models: transformers' RMSNorm and
GPT-2's `Conv1D`, the causal mask, attention and rotary embedding, with transformers'
arithmetic (`zoo.layers.causal` states the conventions), so that the reference needs no
`transformers`. Importing this module registers `Conv1D` with its layer kind (`hf_conv1d`)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import canonical

__all__ = ["Conv1D", "RMSNorm", "attend", "causal_mask", "rotary"]


class RMSNorm(nn.RMSNorm):
    """`torch.nn.RMSNorm` (parameter `weight`, layer kind `rms_norm`) computing transformers'
    `LlamaRMSNorm`: statistics in float32, the normalised input cast back to its dtype, then
    times the weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class Conv1D(nn.Module):
    """transformers' `Conv1D(nf, nx)`: `weight` `(nx, nf)` = `(in, out)`, `bias` `(nf,)`,
    computing `x @ weight + bias` (as `torch.addmm`)."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = (*x.size()[:-1], self.nf)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size)


canonical.register_class("hf_conv1d", "torch", Conv1D)


def causal_mask(length: int, attention_mask: torch.Tensor | None = None,
                window: int | None = None) -> torch.Tensor:
    """`(N or 1, 1, L, L)` booleans: key `j` visible from query `i` when `j <= i`, `i - j <
    window` (if any) and `attention_mask[:, j]` (if given)."""
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    visible = j <= i
    if window is not None:
        visible = visible & (j > i - window)
    visible = visible[None, None]
    if attention_mask is not None:
        visible = visible & attention_mask.bool()[:, None, None, :]
    return visible


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           scale: float, dropout: nn.Module | None = None) -> torch.Tensor:
    """transformers' eager attention over `(N, heads, L, D)` queries and `(N, kv_heads, L, D)`
    keys and values (`repeat_kv`): logits scaled, masked with the lowest float, softmax in
    float32, weights cast back, `dropout` on them. Returns `(N, L, heads * D)`."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    w = torch.matmul(q, k.transpose(2, 3)) * scale
    w = w.masked_fill(~mask, torch.finfo(w.dtype).min)
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    if dropout is not None:
        w = dropout(w)
    out = torch.matmul(w, v).transpose(1, 2)
    return out.reshape(*out.shape[:2], -1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(x: torch.Tensor, positions: torch.Tensor, inv_freq: np.ndarray) -> torch.Tensor:
    """`x` `(N, heads, L, D)` rotated at `positions` `(N, L)` (transformers' `rotate_half`
    convention; angles in float32, cosines and sines cast to `x`'s dtype)."""
    freqs = positions[..., None].float() * torch.from_numpy(inv_freq).to(x.device)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (N, 1, L, D)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return x * cos + _rotate_half(x) * sin
