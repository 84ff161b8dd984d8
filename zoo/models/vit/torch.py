"""ViT in PyTorch: the reference, with timm's module names and its `Attention` layout (one
packed `qkv` Linear, heads split as `(3, heads, head_dim)`), batched `(N, C, H, W)`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.intermediates import TOKENS, check_format, permutation, take_indices
from zoo.models.vit.config import ViTConfig


def _layer_norm(config: ViTConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.width, eps=config.norm_eps)


class PatchEmbed(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        p = config.patch_size
        self.proj = nn.Conv2d(config.in_channels, config.width, p, stride=p,
                              bias=not config.pre_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (N, patches, width)


class Attention(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.width, 3 * config.width, bias=config.qkv_bias)
        self.proj = nn.Linear(config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v)  # scale 1/sqrt(head_dim)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.width, config.mlp_hidden)
        self.fc2 = nn.Linear(config.mlp_hidden, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # exact (erf) GELU


class LayerScale(nn.Module):
    """timm's LayerScale: a learned per-channel scale `gamma` (starts at `init_values`)."""

    def __init__(self, width: int, init_values: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((width,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


def _layer_scale(config: ViTConfig) -> nn.Module:
    return (nn.Identity() if config.init_values is None
            else LayerScale(config.width, config.init_values))


class Block(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.norm1 = _layer_norm(config)
        self.attn = Attention(config)
        self.ls1 = _layer_scale(config)
        self.norm2 = _layer_norm(config)
        self.mlp = Mlp(config)
        self.ls2 = _layer_scale(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class ViT(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        e = config.width
        self.cls_token = (nn.Parameter(0.02 * torch.randn(1, 1, e)) if config.class_token
                          else None)
        self.reg_token = (nn.Parameter(0.02 * torch.randn(1, config.reg_tokens, e))
                          if config.reg_tokens else None)
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, config.embed_len, e))
        self.patch_embed = PatchEmbed(config)
        self.norm_pre = _layer_norm(config) if config.pre_norm else nn.Identity()
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.depth)])
        self.norm = nn.Identity() if config.use_fc_norm else _layer_norm(config)
        self.fc_norm = _layer_norm(config) if config.use_fc_norm else nn.Identity()
        self.head = nn.Linear(e, config.num_classes)

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """Prefix tokens and patch tokens, position embedding added (timm's `_pos_embed`)."""
        patches = self.patch_embed(x)
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token)
                  if t is not None]
        if self.config.no_embed_class:
            return torch.cat([*prefix, patches + self.pos_embed], dim=1)
        return torch.cat([*prefix, patches], dim=1) + self.pos_embed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Every token after the blocks and the final `norm`, `(N, seq, width)` (timm's)."""
        return self.forward_intermediates(x, indices=1, output_fmt="NLC")[0]

    def forward_intermediates(
            self, x: torch.Tensor, indices: int | Sequence[int] | None = None,
            return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
            output_fmt: str = "NCHW", intermediates_only: bool = False) -> Any:
        """timm's: `(forward_features(x), taps)` or, `intermediates_only`, the taps: the
        tokens after each block (`norm`: with the final `norm`), the prefix tokens left out,
        the patches as a map in `output_fmt`: "NCHW" (the default), "NHWC", or "NLC" (the
        tokens, `(N, patches, width)`). `indices`: the last n blocks (int), those listed, or
        all (None); `stop_early` skips the blocks after the last one taken;
        `return_prefix_tokens`: each tap is `(map, prefix tokens (N, prefix, width))` (when
        the model has any)."""
        take, last = take_indices(self.config.depth, indices)
        check_format(output_fmt, TOKENS)
        self.config.check_input(x.shape)
        tokens = self.norm_pre(self._embed(x))
        taps = []
        for i, block in enumerate(self.blocks[:last + 1] if stop_early else self.blocks):
            tokens = block(tokens)
            if i in take:
                taps.append(self.norm(tokens) if norm else tokens)
        n = self.config.num_prefix_tokens
        maps = [t[:, n:] for t in taps]
        if output_fmt != "NLC":
            grid = (x.shape[0], *self.config.grid, self.config.width)
            maps = [t.reshape(grid).permute(permutation("NHWC", output_fmt)) for t in maps]
        if return_prefix_tokens and n:
            maps = [(m, t[:, :n]) for m, t in zip(maps, taps, strict=True)]
        return maps if intermediates_only else (self.norm(tokens), maps)

    def reset_classifier(self, num_classes: int) -> None:
        """A new `head` for `num_classes`, initialised by PyTorch (in place, as timm's; the
        config follows)."""
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        self.head = nn.Linear(self.config.width, num_classes, dtype=self.head.weight.dtype,
                               device=self.head.weight.device)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Logits of the tokens: pool (class token or patch average), `fc_norm`, `head`
        (`pre_logits`: before the head)."""
        pooled = (x[:, 0] if self.config.global_pool == "token"
                  else x[:, self.config.num_prefix_tokens:].mean(dim=1))
        pooled = self.fc_norm(pooled)
        return pooled if pre_logits else self.head(pooled)
