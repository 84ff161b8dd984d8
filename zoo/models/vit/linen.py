"""ViT in Flax Linen: batched `(N, H, W, C)` input, tokens `(N, seq, width)`."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.layers.attention import dot_product_attention
from zoo.models.common import dtype_of
from zoo.models.vit.config import ViTConfig


def _layer_norm(config: ViTConfig, dtype: jnp.dtype) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=config.norm_eps, use_fast_variance=False, param_dtype=dtype)


class PatchEmbed(nn.Module):
    config: ViTConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        p = self.config.patch_size
        self.proj = nn.Conv(self.config.width, (p, p), strides=(p, p), padding="VALID",
                            param_dtype=dtype_of(self.param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.proj(x)  # (N, rows, cols, width)
        return y.reshape(y.shape[0], -1, y.shape[-1])  # row-major patches, as timm


class Mlp(nn.Module):
    config: ViTConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        self.fc1 = nn.Dense(self.config.mlp_hidden, param_dtype=dt)
        self.fc2 = nn.Dense(self.config.width, param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(nn.gelu(self.fc1(x), approximate=False))


class Block(nn.Module):
    config: ViTConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        self.norm1 = _layer_norm(cfg, dt)
        self.attn = nn.MultiHeadDotProductAttention(
            cfg.num_heads, param_dtype=dt, attention_fn=dot_product_attention)
        self.norm2 = _layer_norm(cfg, dt)
        self.mlp = Mlp(cfg, self.param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    config: ViTConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        init = nn.initializers.normal(0.02)
        self.patch_embed = PatchEmbed(cfg, self.param_dtype)
        self.cls_token = self.param("cls_token", init, (1, 1, cfg.width), dt)
        self.pos_embed = self.param("pos_embed", init, (1, cfg.seq_len, cfg.width), dt)
        self.blocks = [Block(cfg, self.param_dtype) for _ in range(cfg.depth)]
        self.norm = _layer_norm(cfg, dt)
        self.head = nn.Dense(cfg.num_classes, param_dtype=dt)

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        self.config.check_input(x.shape, channels_last=True)
        tokens = self.patch_embed(x)
        cls = jnp.broadcast_to(self.cls_token, (x.shape[0], 1, self.config.width))
        tokens = jnp.concatenate([cls.astype(tokens.dtype), tokens], axis=1) + self.pos_embed
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.norm(tokens[:, 0]))
