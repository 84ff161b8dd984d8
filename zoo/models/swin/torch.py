"""Swin Transformer in PyTorch: the reference, with timm's module names and layout (tokens
`(N, H, W, C)` between the layers, as timm's `output_fmt="NHWC"`), batched `(N, C, H, W)`
input."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.layers.torch import DropPath
from zoo.models.intermediates import MAPS, check_format, permutation, take_indices
from zoo.models.swin.config import (
    SwinConfig,
    attention_mask,
    padded,
    relative_position_index,
)


def _layer_norm(config: SwinConfig, dim: int) -> nn.LayerNorm:
    return nn.LayerNorm(dim, eps=config.norm_eps)


def window_partition(x: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """`(N, H, W, C)` -> `(N * windows, wh * ww, C)` (timm's `window_partition`)."""
    n, h, w, c = x.shape
    x = x.view(n, h // window[0], window[0], w // window[1], window[1], c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window[0] * window[1], c)


def window_reverse(windows: torch.Tensor, window: tuple[int, int], h: int, w: int
                   ) -> torch.Tensor:
    """The inverse of `window_partition` for an `(h, w)` grid (timm's `window_reverse`)."""
    c = windows.shape[-1]
    x = windows.view(-1, h // window[0], w // window[1], window[0], window[1], c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, h, w, c)


class PatchEmbed(nn.Module):
    def __init__(self, config: SwinConfig) -> None:
        super().__init__()
        p = config.patch_size
        self.proj = nn.Conv2d(config.in_channels, config.embed_dim, p, stride=p)
        self.norm = _layer_norm(config, config.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).permute(0, 2, 3, 1))  # (N, H, W, C)


class WindowAttention(nn.Module):
    """timm's `WindowAttention`: multi-head self-attention within each window, plus a learned
    bias per head and relative position (`relative_position_bias_table`, indexed by the
    derived, non-persistent `relative_position_index`)."""

    def __init__(self, config: SwinConfig, dim: int, heads: int,
                 window: tuple[int, int]) -> None:
        super().__init__()
        self.num_heads, self.window = heads, window
        size = (2 * window[0] - 1) * (2 * window[1] - 1)
        self.relative_position_bias_table = nn.Parameter(0.02 * torch.randn(size, heads))
        self.register_buffer("relative_position_index",
                             torch.from_numpy(relative_position_index(window)).long(),
                             persistent=False)
        self.qkv = nn.Linear(dim, 3 * dim, bias=config.qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        bias = bias.view(n, n, -1).permute(2, 0, 1).unsqueeze(0)  # (1, heads, n, n)
        if mask is not None:  # (windows, n, n), the same for every image
            windows = mask.shape[0]
            bias = (bias.unsqueeze(1) + mask[None, :, None]).reshape(-1, self.num_heads, n, n)
            bias = bias.repeat(b // windows, 1, 1, 1)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwinTransformerBlock(nn.Module):
    def __init__(self, config: SwinConfig, stage: int, index: int, drop_path: float) -> None:
        super().__init__()
        dim = config.stage_dim(stage)
        self.resolution = config.resolution(stage)
        self.window = config.window(stage)
        self.shift = config.block_shift(stage, index)
        self.norm1 = _layer_norm(config, dim)
        self.attn = WindowAttention(config, dim, config.num_heads[stage], self.window)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = _layer_norm(config, dim)
        self.mlp = Mlp(dim, config.mlp_hidden(stage))
        self.drop_path2 = DropPath(drop_path)
        mask = attention_mask(padded(self.resolution, self.window), self.window, self.shift)
        self.register_buffer("attn_mask", None if mask is None else torch.from_numpy(mask),
                             persistent=False)

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        _, h, w, _ = x.shape
        shifted = any(self.shift)
        if shifted:
            x = torch.roll(x, shifts=(-self.shift[0], -self.shift[1]), dims=(1, 2))
        hp, wp = padded((h, w), self.window)
        x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
        windows = self.attn(window_partition(x, self.window), mask=self.attn_mask)
        x = window_reverse(windows, self.window, hp, wp)[:, :h, :w]
        return torch.roll(x, shifts=self.shift, dims=(1, 2)) if shifted else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self._attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    """timm's `PatchMerging`: each 2x2 neighbourhood concatenated (column offset, then row
    offset, then channels: the original x0, x1, x2, x3), normalised, projected."""

    def __init__(self, config: SwinConfig, dim: int) -> None:
        super().__init__()
        self.norm = _layer_norm(config, 4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, h, w, c = x.shape
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        h, w = h + h % 2, w + w % 2
        x = x.reshape(n, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return self.reduction(self.norm(x))


class SwinTransformerStage(nn.Module):
    def __init__(self, config: SwinConfig, stage: int) -> None:
        super().__init__()
        self.downsample = (PatchMerging(config, config.stage_dim(stage - 1)) if stage
                           else nn.Identity())
        rates = config.drop_path_rates()[stage]
        self.blocks = nn.Sequential(*[SwinTransformerBlock(config, stage, j, rate)
                                      for j, rate in enumerate(rates)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class ClassifierHead(nn.Module):
    """timm's `ClassifierHead` (average pool over the map, then `fc`; no `fc` for 0 classes)."""

    def __init__(self, config: SwinConfig) -> None:
        super().__init__()
        n = config.num_classes
        self.fc = nn.Linear(config.num_features, n) if n else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x.mean(dim=(1, 2))
        return x if pre_logits else self.fc(x)


class Swin(nn.Module):
    def __init__(self, config: SwinConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.layers = nn.Sequential(*[SwinTransformerStage(config, i)
                                      for i in range(config.num_stages)])
        self.norm = _layer_norm(config, config.num_features)
        self.head = ClassifierHead(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's map after the final `norm`, channels-last `(N, H, W, C)` as
        timm's."""
        self.config.check_input(x.shape)
        return self.norm(self.layers(self.patch_embed(x)))

    def forward_intermediates(
            self, x: torch.Tensor, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW",
            intermediates_only: bool = False) -> Any:
        """timm's: `(final features, taps)` or, `intermediates_only`, the taps: each stage's
        map (`norm`: the last one with the final `norm`) in `output_fmt`, "NCHW" (the
        default) or "NHWC"; the final features are `forward_features`' (without the final
        `norm` when `stop_early` ends before the last stage). `indices`: the last n stages
        (int), those listed, or all (None)."""
        take, last = take_indices(self.config.num_stages, indices)
        check_format(output_fmt, MAPS)
        self.config.check_input(x.shape)
        x = self.patch_embed(x)
        stages = self.layers[:last + 1] if stop_early else self.layers
        taps = []
        for i, stage in enumerate(stages):
            x = stage(x)
            if i in take:
                tap = self.norm(x) if norm and i == self.config.num_stages - 1 else x
                taps.append(tap.permute(permutation("NHWC", output_fmt)))
        if intermediates_only:
            return taps
        return (self.norm(x) if len(stages) == self.config.num_stages else x), taps

    def reset_classifier(self, num_classes: int) -> None:
        """A new head for `num_classes` (0: none), initialised by PyTorch (in place, as
        timm's; the config follows)."""
        like = self.norm.weight
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        self.head = ClassifierHead(self.config).to(like.dtype).to(like.device)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Logits of the final map: the average pool and `head.fc` (`pre_logits`: before it)."""
        return self.head(x, pre_logits=pre_logits)
