"""ViT in Equinox: per-sample `(C, H, W)` input, tokens `(seq, width)`, batched with vmap."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.models.common import dtype_of
from zoo.models.vit.config import ViTConfig


class PatchEmbed(eqx.Module):
    proj: eqx.nn.Conv2d  # kernel = stride = patch size

    def __call__(self, x: Array) -> Array:
        y = self.proj(x)  # (width, rows, cols)
        return y.reshape(y.shape[0], -1).T  # (patches, width), row-major as timm


class Mlp(eqx.Module):
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear

    def __call__(self, x: Array) -> Array:  # one token
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp: Mlp

    def __init__(self, config: ViTConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        e = config.width
        self.norm1 = eqx.nn.LayerNorm(e, eps=config.norm_eps, dtype=dtype)
        self.attn = eqx.nn.MultiheadAttention(
            config.num_heads, e, use_query_bias=True, use_key_bias=True, use_value_bias=True,
            use_output_bias=True, dtype=dtype, key=k1)
        self.norm2 = eqx.nn.LayerNorm(e, eps=config.norm_eps, dtype=dtype)
        self.mlp = Mlp(eqx.nn.Linear(e, config.mlp_hidden, key=k2, dtype=dtype),
                       eqx.nn.Linear(config.mlp_hidden, e, key=k3, dtype=dtype))

    def __call__(self, x: Array) -> Array:  # (seq, width)
        y = jax.vmap(self.norm1)(x)
        x = x + self.attn(y, y, y)
        return x + jax.vmap(lambda t: self.mlp(self.norm2(t)))(x)


class ViT(eqx.Module):
    patch_embed: PatchEmbed
    cls_token: Array  # (1, 1, width), as timm
    pos_embed: Array  # (1, seq, width)
    blocks: tuple[Block, ...]
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear
    config: ViTConfig = eqx.field(static=True)

    def __init__(self, config: ViTConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        dt = dtype_of(dtype)
        kp, kc, kpos, kh, *kb = jax.random.split(key, 4 + config.depth)
        p, e = config.patch_size, config.width
        self.patch_embed = PatchEmbed(eqx.nn.Conv2d(config.in_channels, e, (p, p), (p, p),
                                                    key=kp, dtype=dt))
        self.cls_token = 0.02 * jax.random.normal(kc, (1, 1, e), dt)
        self.pos_embed = 0.02 * jax.random.normal(kpos, (1, config.seq_len, e), dt)
        self.blocks = tuple(Block(config, key=k, dtype=dt) for k in kb)
        self.norm = eqx.nn.LayerNorm(e, eps=config.norm_eps, dtype=dt)
        self.head = eqx.nn.Linear(e, config.num_classes, key=kh, dtype=dt)
        self.config = config

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Logits of one image `x` of shape `(C, H, W)`."""
        self.config.check_input(x.shape, batched=False)
        tokens = jnp.concatenate([self.cls_token[0], self.patch_embed(x)]) + self.pos_embed[0]
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.norm(tokens[0]))  # the class token
