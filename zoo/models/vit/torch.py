"""ViT in PyTorch: the reference, with timm's module names and its `Attention` layout (one
packed `qkv` Linear, heads split as `(3, heads, head_dim)`), batched `(N, C, H, W)`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.layers.torch import DropPath
from zoo.models.intermediates import TOKENS, check_format, permutation, take_indices
from zoo.models.vit.config import ViTConfig

ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
               "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "silu": F.silu}


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
    """timm's `Mlp` (`fc1`, the activation, `fc2`), or its `SwiGLUPacked` (`gated`: `fc1`'s
    outputs split in halves, `act(first) * second`, into `fc2`)."""

    def __init__(self, config: ViTConfig, hidden: int | None = None,
                 gated: bool | None = None) -> None:
        super().__init__()
        self.gated = config.mlp_layer == "swiglu_packed" if gated is None else gated
        hidden = config.mlp_hidden if hidden is None else hidden
        self.act = ACTIVATIONS[config.act_layer]
        self.fc1 = nn.Linear(config.width, hidden)
        self.fc2 = nn.Linear(hidden // 2 if self.gated else hidden, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        if self.gated:
            x1, x2 = x.chunk(2, dim=-1)
            return self.fc2(self.act(x1) * x2)
        return self.fc2(self.act(x))


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
    def __init__(self, config: ViTConfig, drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm1 = _layer_norm(config)
        self.attn = Attention(config)
        self.ls1 = _layer_scale(config)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = _layer_norm(config)
        self.mlp = Mlp(config)
        self.ls2 = _layer_scale(config)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class AttentionPool(nn.Module):
    """timm's `AttentionPoolLatent` (`global_pool="map"`): a learned `latent` query, projected
    by `q`, attends to the tokens projected by `kv` (keys, then values); `proj`, then a
    residual MLP after `norm`; the one latent token is the pooled feature."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        e = config.width
        self.num_heads = config.num_heads
        self.latent = nn.Parameter(0.02 * torch.randn(1, 1, e))
        self.q = nn.Linear(e, e)
        self.kv = nn.Linear(e, 2 * e)
        self.proj = nn.Linear(e, e)
        self.norm = _layer_norm(config)
        self.mlp = Mlp(config, config.pool_hidden, gated=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        h = self.num_heads
        q = self.q(self.latent.expand(b, -1, -1)).reshape(b, 1, h, -1).transpose(1, 2)
        k, v = self.kv(x).reshape(b, n, 2, h, -1).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, 1, c)
        x = self.proj(x)
        return (x + self.mlp(self.norm(x)))[:, 0]


def resample(pos_embed: torch.Tensor, grid: tuple[int, int], old_grid: tuple[int, int],
             prefix: int) -> torch.Tensor:
    """timm's `resample_abs_pos_embed`: the patch rows of `pos_embed` resampled from
    `old_grid` to `grid` (bicubic with antialiasing), the `prefix` rows kept."""
    if tuple(grid) == tuple(old_grid):
        return pos_embed
    head, patches = pos_embed[:, :prefix], pos_embed[:, prefix:]
    e = pos_embed.shape[-1]
    image = patches.reshape(1, *old_grid, e).permute(0, 3, 1, 2).float()
    image = F.interpolate(image, size=tuple(grid), mode="bicubic", antialias=True)
    patches = image.permute(0, 2, 3, 1).reshape(1, -1, e).to(pos_embed.dtype)
    return torch.cat([head, patches], dim=1)


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
        self.dist_token = (nn.Parameter(0.02 * torch.randn(1, 1, e)) if config.distilled
                           else None)
        self.patch_embed = PatchEmbed(config)
        self.norm_pre = _layer_norm(config) if config.pre_norm else nn.Identity()
        self.blocks = nn.ModuleList([Block(config, rate) for rate in config.drop_path_rates()])
        self.norm = nn.Identity() if config.use_fc_norm else _layer_norm(config)
        self.attn_pool = AttentionPool(config) if config.global_pool == "map" else None
        self.fc_norm = _layer_norm(config) if config.use_fc_norm else nn.Identity()
        self.head = self._head()
        self.head_dist = self._head() if config.distilled else None

    def _head(self) -> nn.Module:
        """A classifier for `config.num_classes` (the identity for 0, as timm's)."""
        n = self.config.num_classes
        return nn.Linear(self.config.width, n) if n else nn.Identity()

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """Prefix tokens and patch tokens, position embedding added (timm's `_pos_embed`)."""
        patches = self.patch_embed(x)
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.dist_token,
                                                          self.reg_token) if t is not None]
        pos_embed = self.pos_embed
        if self.config.dynamic_img_size:
            pos_embed = resample(pos_embed, self.config.grid_of(x.shape[2:]), self.config.grid,
                                 self.config.pos_prefix)
        if self.config.no_embed_class:
            return torch.cat([*prefix, patches + pos_embed], dim=1)
        return torch.cat([*prefix, patches], dim=1) + pos_embed

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
            grid = (x.shape[0], *self.config.grid_of(x.shape[2:]), self.config.width)
            maps = [t.reshape(grid).permute(permutation("NHWC", output_fmt)) for t in maps]
        if return_prefix_tokens and n:
            maps = [(m, t[:, :n]) for m, t in zip(maps, taps, strict=True)]
        return maps if intermediates_only else (self.norm(tokens), maps)

    def reset_classifier(self, num_classes: int) -> None:
        """A new `head` (and DeiT's `head_dist`) for `num_classes` (0: none), initialised by
        PyTorch (in place, as timm's; the config follows)."""
        like = self.pos_embed
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        self.head = self._head().to(like.dtype).to(like.device)
        if self.config.distilled:
            self.head_dist = self._head().to(like.dtype).to(like.device)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Logits of the tokens: pool (class token, patch average or attention pool),
        `fc_norm`, `head` (`pre_logits`: before the head); DeiT's distilled model averages its
        two heads (and its two tokens before them)."""
        cfg = self.config
        if cfg.distilled:
            cls, dist = x[:, 0], x[:, 1]
            if pre_logits:
                return (cls + dist) / 2
            return (self.head(cls) + self.head_dist(dist)) / 2
        patches = x[:, cfg.num_prefix_tokens:]
        if cfg.global_pool == "map":
            pooled = self.attn_pool(patches)
        else:
            pooled = x[:, 0] if cfg.global_pool == "token" else patches.mean(dim=1)
        pooled = self.fc_norm(pooled)
        return pooled if pre_logits else self.head(pooled)
