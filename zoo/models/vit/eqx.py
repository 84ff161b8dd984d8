"""ViT in Equinox: per-sample `(C, H, W)` input, tokens `(seq, width)`, batched with vmap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.activations import gelu
from zoo.layers.eqx import LayerNorm, Linear, MultiheadAttention, with_new_head
from zoo.models.common import dtype_of
from zoo.models.intermediates import TOKENS, check_format, permutation, take_indices
from zoo.models.vit.config import ViTConfig


def _layer_norm(config: ViTConfig, dtype) -> LayerNorm:
    return LayerNorm(config.width, eps=config.norm_eps, dtype=dtype)


def _tokenwise(layer: eqx.Module | None, tokens: Array) -> Array:
    """`layer` applied to every token of `(seq, width)` (None: the identity)."""
    return tokens if layer is None else jax.vmap(layer)(tokens)


class PatchEmbed(eqx.Module):
    proj: eqx.nn.Conv2d  # kernel = stride = patch size

    def __call__(self, x: Array) -> Array:
        y = self.proj(x)  # (width, rows, cols)
        return y.reshape(y.shape[0], -1).T  # (patches, width), row-major as timm


class Mlp(eqx.Module):
    fc1: Linear
    fc2: Linear

    def __call__(self, x: Array) -> Array:  # one token
        return self.fc2(gelu(self.fc1(x)))


class LayerScale(eqx.Module):
    """timm's LayerScale: a learned per-channel scale `gamma` (starts at `init_values`)."""

    gamma: Array

    def __call__(self, x: Array) -> Array:
        return x * self.gamma


class Block(eqx.Module):
    norm1: LayerNorm
    attn: MultiheadAttention
    ls1: LayerScale | None
    norm2: LayerNorm
    mlp: Mlp
    ls2: LayerScale | None

    def __init__(self, config: ViTConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        e, qkv_bias = config.width, config.qkv_bias
        self.norm1 = _layer_norm(config, dtype)
        self.attn = MultiheadAttention(
            config.num_heads, e, use_query_bias=qkv_bias, use_key_bias=qkv_bias,
            use_value_bias=qkv_bias, use_output_bias=True, dtype=dtype, key=k1)
        self.norm2 = _layer_norm(config, dtype)
        self.mlp = Mlp(Linear(e, config.mlp_hidden, key=k2, dtype=dtype),
                       Linear(config.mlp_hidden, e, key=k3, dtype=dtype))
        self.ls1, self.ls2 = (
            [LayerScale(jnp.full((e,), config.init_values, dtype)) for _ in range(2)]
            if config.init_values is not None else (None, None))

    def __call__(self, x: Array) -> Array:  # (seq, width)
        y = _tokenwise(self.norm1, x)
        x = x + _tokenwise(self.ls1, self.attn(y, y, y))
        return x + _tokenwise(self.ls2, jax.vmap(lambda t: self.mlp(self.norm2(t)))(x))


class ViT(eqx.Module):
    patch_embed: PatchEmbed
    cls_token: Array | None  # (1, 1, width), as timm
    reg_token: Array | None  # (1, reg_tokens, width)
    pos_embed: Array  # (1, embed_len, width)
    norm_pre: LayerNorm | None
    blocks: tuple[Block, ...]
    norm: LayerNorm | None
    fc_norm: LayerNorm | None
    head: Linear
    config: ViTConfig = eqx.field(static=True)

    def __init__(self, config: ViTConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        dt = dtype_of(dtype)
        kp, kc, kr, kpos, kh, *kb = jax.random.split(key, 5 + config.depth)
        p, e = config.patch_size, config.width
        self.patch_embed = PatchEmbed(eqx.nn.Conv2d(config.in_channels, e, (p, p), (p, p),
                                                    use_bias=not config.pre_norm, key=kp,
                                                    dtype=dt))
        self.cls_token = (0.02 * jax.random.normal(kc, (1, 1, e), dt)
                          if config.class_token else None)
        self.reg_token = (0.02 * jax.random.normal(kr, (1, config.reg_tokens, e), dt)
                          if config.reg_tokens else None)
        self.pos_embed = 0.02 * jax.random.normal(kpos, (1, config.embed_len, e), dt)
        self.norm_pre = _layer_norm(config, dt) if config.pre_norm else None
        self.blocks = tuple(Block(config, key=k, dtype=dt) for k in kb)
        self.norm = None if config.use_fc_norm else _layer_norm(config, dt)
        self.fc_norm = _layer_norm(config, dt) if config.use_fc_norm else None
        self.head = Linear(e, config.num_classes, key=kh, dtype=dt)
        self.config = config

    def _embed(self, x: Array) -> Array:
        """Prefix tokens and patch tokens, position embedding added (timm's `_pos_embed`)."""
        patches = self.patch_embed(x)
        prefix = [t[0] for t in (self.cls_token, self.reg_token) if t is not None]
        if self.config.no_embed_class:
            return jnp.concatenate([*prefix, patches + self.pos_embed[0]])
        return jnp.concatenate([*prefix, patches]) + self.pos_embed[0]

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Logits of one image `x` of shape `(C, H, W)`."""
        return self.forward_head(self.forward_features(x))

    def forward_features(self, x: Array) -> Array:
        """Every token of one image after the blocks and the final `norm`, `(seq, width)`
        (timm's)."""
        return self.forward_intermediates(x, indices=1, output_fmt="NLC")[0]

    def forward_intermediates(
            self, x: Array, indices: int | Sequence[int] | None = None,
            return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
            output_fmt: str = "NCHW", intermediates_only: bool = False) -> Any:
        """timm's, per image: `(forward_features(x), taps)` or, `intermediates_only`, the
        taps: the tokens after each block (`norm`: with the final `norm`), the prefix tokens
        left out, the patches as a map: `(C, H, W)` for `output_fmt` "NCHW" (the default),
        `(H, W, C)` for "NHWC", the tokens `(patches, width)` for "NLC". `indices`: the last
        n blocks (int), those listed, or all (None); `stop_early` skips the blocks after the
        last one taken; `return_prefix_tokens`: each tap is `(map, prefix tokens (prefix,
        width))` (when the model has any)."""
        take, last = take_indices(self.config.depth, indices)
        check_format(output_fmt, TOKENS)
        self.config.check_input(x.shape, batched=False)
        tokens = _tokenwise(self.norm_pre, self._embed(x))
        taps = []
        for i, block in enumerate(self.blocks[:last + 1] if stop_early else self.blocks):
            tokens = block(tokens)
            if i in take:
                taps.append(_tokenwise(self.norm, tokens) if norm else tokens)
        n = self.config.num_prefix_tokens
        maps = [t[n:] for t in taps]
        if output_fmt != "NLC":
            grid = (*self.config.grid, self.config.width)
            perm = permutation("NHWC", output_fmt, batched=False)
            maps = [t.reshape(grid).transpose(perm) for t in maps]
        if return_prefix_tokens and n:
            maps = [(m, t[:n]) for m, t in zip(maps, taps, strict=True)]
        return maps if intermediates_only else (_tokenwise(self.norm, tokens), maps)

    def reset_classifier(self, num_classes: int, *, key: PRNGKeyArray) -> ViT:
        """A new model whose `head` is a fresh Equinox Linear for `num_classes` (and whose
        config says so); this one is not changed."""
        return with_new_head(self, "head", self.config.width, num_classes, key=key)

    def forward_head(self, x: Array, pre_logits: bool = False) -> Array:
        """Logits of one image's tokens: pool (class token or patch average), `fc_norm`,
        `head` (`pre_logits`: before the head)."""
        pooled = (x[0] if self.config.global_pool == "token"
                  else x[self.config.num_prefix_tokens:].mean(axis=0))
        pooled = pooled if self.fc_norm is None else self.fc_norm(pooled)
        return pooled if pre_logits else self.head(pooled)
