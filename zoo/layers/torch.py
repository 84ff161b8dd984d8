"""PyTorch layers of the zoo's reference models (imported with torch, by the `torch` models):
timm's drop path, LayerNorm2d and GRN; transformers' RMSNorm and GPT-2's `Conv1D`, the causal
mask, attention and rotary embedding with transformers' arithmetic (`zoo.layers.causal` states
the conventions), so that the reference needs no `transformers`. Importing this module
registers the layer kinds of its classes (`global_response_norm`, `hf_conv1d`). `KVCache` is the
reference's own KV cache for decoding."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import canonical

__all__ = ["Conv1D", "DropPath", "GlobalResponseNorm", "KVCache", "LayerNorm2d", "OffsetRMSNorm",
           "RMSNorm", "attend", "causal_mask", "rotary", "softcap"]


class DropPath(nn.Module):
    """timm's `DropPath` (stochastic depth, `scale_by_keep=True`): in training, each sample of
    the batch (axis 0) is kept with probability `1 - rate` and scaled by `1 / (1 - rate)`; the
    identity in eval mode and at `rate == 0`. The mask is drawn as timm draws it (`bernoulli_`
    on the default generator, nothing drawn at `rate == 0`), so a seeded run equals timm's.

    `keep`: a `(N,)` mask to use instead of drawing one (None: draw). Tests give it the mask
    the JAX libraries draw from a key (`zoo.layers.drop_path.keep_mask`), which PyTorch's
    generator cannot reproduce."""

    def __init__(self, rate: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"drop path rate must be in [0, 1), found {rate}")
        self.rate = rate
        self.keep: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return x
        keep_prob = 1.0 - self.rate
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        if self.keep is None:
            mask = x.new_empty(shape).bernoulli_(keep_prob)
        else:
            if tuple(self.keep.shape) != (x.shape[0],):
                raise ValueError(f"DropPath.keep holds {self.keep.numel()} values (shape "
                                 f"{tuple(self.keep.shape)}) for a batch of {x.shape[0]}")
            mask = self.keep.to(x.dtype).reshape(shape).clone()
        return x * mask.div_(keep_prob)

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


class LayerNorm2d(nn.LayerNorm):
    """timm's `LayerNorm2d`: a LayerNorm over the channels of an `(N, C, H, W)` map (the
    `layer_norm` kind, as every `nn.LayerNorm`); eps 1e-6 by default, as timm's."""

    def __init__(self, num_channels: int, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(num_channels, eps=eps, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class GlobalResponseNorm(nn.Module):
    """timm's `GlobalResponseNorm` (ConvNeXt V2), the same computation: `weight`, `bias` of
    the channels (zeros at first); channels last `(N, H, W, C)` or first `(N, C, H, W)`."""

    def __init__(self, dim: int, eps: float = 1e-6, channels_last: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.spatial_dim, self.channel_dim, self.wb_shape = (
            ((1, 2), -1, (1, 1, 1, -1)) if channels_last else ((2, 3), 1, (1, -1, 1, 1)))
        self.weight = nn.Parameter(torch.zeros(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_g = x.norm(p=2, dim=self.spatial_dim, keepdim=True)
        x_n = x_g / (x_g.mean(dim=self.channel_dim, keepdim=True) + self.eps)
        return x + torch.addcmul(self.bias.view(self.wb_shape), self.weight.view(self.wb_shape),
                                 x * x_n)


canonical.register_class("global_response_norm", "torch", GlobalResponseNorm)


class RMSNorm(nn.RMSNorm):
    """`torch.nn.RMSNorm` (parameter `weight`, layer kind `rms_norm`) computing transformers'
    `LlamaRMSNorm`: statistics in float32, the normalised input cast back to its dtype, then
    times the weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class OffsetRMSNorm(nn.Module):
    """transformers' `GemmaRMSNorm` (layer kind `offset_rms_norm`): the normalised input times
    `1 + weight`, in float32, cast back to the input's dtype; `weight` starts at zero."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


canonical.register_class("offset_rms_norm", "torch", OffsetRMSNorm)


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
                window: int | None = None, index: int = 0,
                kv_length: int | None = None, causal: bool = True) -> torch.Tensor:
    """`(N or 1, 1, L, Lk)` booleans: key `j` visible from query `i` when `j <= i` (if
    `causal`), `i - j < window` (if any) and `attention_mask[:, j]` (if given); the queries are
    the slots `index ..` of `kv_length` (default: `L` from 0, a call without a cache)."""
    i = index + torch.arange(length)[:, None]
    j = torch.arange(length if kv_length is None else kv_length)[None, :]
    visible = j <= i if causal else torch.ones(i.shape[0], j.shape[1], dtype=torch.bool)
    if window is not None:
        visible = visible & (j > i - window)
    visible = visible[None, None]
    if attention_mask is not None:
        visible = visible & attention_mask.bool()[:, None, None, :]
    return visible


class LayerCache:
    """One attention layer's slice of a `KVCache`."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, index: int) -> None:
        self.keys, self.values, self.index = keys, values, index

    def write(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every slot's keys and values once `k`, `v` `(N, kv_heads, L, D)` are written in
        place at the cache's index."""
        end = self.index + k.shape[2]
        self.keys[:, :, self.index:end] = k
        self.values[:, :, self.index:end] = v
        return self.keys, self.values


class KVCache:
    """The reference's KV cache: each layer's keys and values preallocated `(N, kv_heads,
    max_length, head_dim)`, written in place at `index`, which the model's call advances."""

    def __init__(self, layers: int, batch: int, max_length: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        shape = (batch, kv_heads, max_length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.index = 0

    @property
    def max_length(self) -> int:
        return self.keys[0].shape[2]

    def layer(self, i: int) -> LayerCache:
        return LayerCache(self.keys[i], self.values[i], self.index)


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """transformers' soft-capping `cap * tanh(x / cap)`; `x` itself when `cap` is None."""
    return x if cap is None else torch.tanh(x / cap) * cap


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           scale: float, dropout: nn.Module | None = None, cap: float | None = None
           ) -> torch.Tensor:
    """transformers' eager attention over `(N, heads, L, D)` queries and `(N, kv_heads, L, D)`
    keys and values (`repeat_kv`): logits scaled, soft-capped by `cap` (if any), masked with
    the lowest float, softmax in float32, weights cast back, `dropout` on them. Returns
    `(N, L, heads * D)`."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    w = softcap(torch.matmul(q, k.transpose(2, 3)) * scale, cap)
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
    convention; angles in float32, cosines and sines cast to `x`'s dtype). Its first
    `2 * len(inv_freq)` dimensions are rotated, the others passed through (transformers'
    partial rotary)."""
    freqs = positions[..., None].float() * torch.from_numpy(inv_freq).to(x.device)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (N, 1, L, R)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    rotated, passed = x[..., :emb.shape[-1]], x[..., emb.shape[-1]:]
    out = rotated * cos + _rotate_half(rotated) * sin
    return out if passed.shape[-1] == 0 else torch.cat((out, passed), dim=-1)
