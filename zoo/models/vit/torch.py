"""ViT in PyTorch: the reference, with timm's module names and its `Attention` layout (one
packed `qkv` Linear, heads split as `(3, heads, head_dim)`), batched `(N, C, H, W)`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.vit.config import ViTConfig


class PatchEmbed(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        p = config.patch_size
        self.proj = nn.Conv2d(config.in_channels, config.width, p, stride=p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (N, patches, width)


class Attention(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
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


class Block(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.width, eps=config.norm_eps)
        self.attn = Attention(config)
        self.norm2 = nn.LayerNorm(config.width, eps=config.norm_eps)
        self.mlp = Mlp(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        e = config.width
        self.patch_embed = PatchEmbed(config)
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, e))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, config.seq_len, e))
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.depth)])
        self.norm = nn.LayerNorm(e, eps=config.norm_eps)
        self.head = nn.Linear(e, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.config.check_input(x.shape)
        tokens = self.patch_embed(x)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos_embed
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.norm(tokens[:, 0]))
