"""ViT in Flax NNX: batched `(N, H, W, C)` input, tokens `(N, seq, width)`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.attention import dot_product_attention
from zoo.models.common import dtype_of
from zoo.models.vit.config import ViTConfig


def _layer_norm(config: ViTConfig, dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(config.width, epsilon=config.norm_eps, use_fast_variance=False,
                         param_dtype=dtype, rngs=rngs)


class PatchEmbed(nnx.Module):
    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        p = config.patch_size
        self.proj = nnx.Conv(config.in_channels, config.width, (p, p), strides=(p, p),
                             padding="VALID", param_dtype=dtype_of(param_dtype), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.proj(x)  # (N, rows, cols, width)
        return y.reshape(y.shape[0], -1, y.shape[-1])  # row-major patches, as timm


class Mlp(nnx.Module):
    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.fc1 = nnx.Linear(config.width, config.mlp_hidden, param_dtype=dt, rngs=rngs)
        self.fc2 = nnx.Linear(config.mlp_hidden, config.width, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(nnx.gelu(self.fc1(x), approximate=False))


class Block(nnx.Module):
    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.norm1 = _layer_norm(config, dt, rngs)
        self.attn = nnx.MultiHeadAttention(
            config.num_heads, config.width, decode=False, param_dtype=dt,
            attention_fn=dot_product_attention, keep_rngs=False, rngs=rngs)
        self.norm2 = _layer_norm(config, dt, rngs)
        self.mlp = Mlp(config, rngs=rngs, param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nnx.Module):
    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        init = nnx.initializers.normal(0.02)
        self.config = config
        self.patch_embed = PatchEmbed(config, rngs=rngs, param_dtype=dt)
        self.cls_token = nnx.Param(init(rngs.params(), (1, 1, config.width), dt))
        self.pos_embed = nnx.Param(init(rngs.params(), (1, config.seq_len, config.width), dt))
        self.blocks = nnx.List([Block(config, rngs=rngs, param_dtype=dt)
                                for _ in range(config.depth)])
        self.norm = _layer_norm(config, dt, rngs)
        self.head = nnx.Linear(config.width, config.num_classes, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        self.config.check_input(x.shape, channels_last=True)
        tokens = self.patch_embed(x)
        cls = jnp.broadcast_to(self.cls_token[...], (x.shape[0], 1, self.config.width))
        tokens = jnp.concatenate([cls.astype(tokens.dtype), tokens], axis=1)
        tokens = tokens + self.pos_embed[...]
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.norm(tokens[:, 0]))
