"""ViT in Flax NNX: batched `(N, H, W, C)` input, tokens `(N, seq, width)`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.activations import gelu
from zoo.layers.attention import dot_product_attention
from zoo.layers.nnx import LayerNorm, MultiHeadAttention
from zoo.models.common import dtype_of
from zoo.models.intermediates import TOKENS, check_format, permutation, take_indices
from zoo.models.vit.config import ViTConfig


def _layer_norm(config: ViTConfig, dtype: jnp.dtype, rngs: nnx.Rngs) -> LayerNorm:
    return LayerNorm(config.width, epsilon=config.norm_eps, param_dtype=dtype, rngs=rngs)


def _apply(layer: nnx.Module | None, x: jax.Array) -> jax.Array:
    """`layer(x)` (None: the identity)."""
    return x if layer is None else layer(x)


class PatchEmbed(nnx.Module):
    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        p = config.patch_size
        self.proj = nnx.Conv(config.in_channels, config.width, (p, p), strides=(p, p),
                             padding="VALID", use_bias=not config.pre_norm,
                             param_dtype=dtype_of(param_dtype), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.proj(x)  # (N, rows, cols, width)
        return y.reshape(y.shape[0], -1, y.shape[-1])  # row-major patches, as timm


class Mlp(nnx.Module):
    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.fc1 = nnx.Linear(config.width, config.mlp_hidden, param_dtype=dt, rngs=rngs)
        self.fc2 = nnx.Linear(config.mlp_hidden, config.width, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(gelu(self.fc1(x)))


class LayerScale(nnx.Module):
    """timm's LayerScale: a learned per-channel scale `gamma` (starts at `init_values`)."""

    def __init__(self, width: int, init_values: float, dtype) -> None:
        self.gamma = nnx.Param(jnp.full((width,), init_values, dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        gamma = self.gamma[...]
        return x * gamma.reshape((1,) * (x.ndim - 1) + gamma.shape)  # explicit rank


class Block(nnx.Module):
    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        scale = config.init_values is not None  # timm's order: norm1, attn, ls1, norm2, mlp, ls2
        self.norm1 = _layer_norm(config, dt, rngs)
        self.attn = MultiHeadAttention(
            config.num_heads, config.width, decode=False, param_dtype=dt,
            qkv_bias=config.qkv_bias, attention_fn=dot_product_attention, keep_rngs=False,
            rngs=rngs)
        self.ls1 = LayerScale(config.width, config.init_values, dt) if scale else None
        self.norm2 = _layer_norm(config, dt, rngs)
        self.mlp = Mlp(config, rngs=rngs, param_dtype=dt)
        self.ls2 = LayerScale(config.width, config.init_values, dt) if scale else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + _apply(self.ls1, self.attn(self.norm1(x)))
        return x + _apply(self.ls2, self.mlp(self.norm2(x)))


class ViT(nnx.Module):
    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        init = nnx.initializers.normal(0.02)
        e = config.width
        self.config = config
        self.patch_embed = PatchEmbed(config, rngs=rngs, param_dtype=dt)
        self.cls_token = (nnx.Param(init(rngs.params(), (1, 1, e), dt))
                          if config.class_token else None)
        self.reg_token = (nnx.Param(init(rngs.params(), (1, config.reg_tokens, e), dt))
                          if config.reg_tokens else None)
        self.pos_embed = nnx.Param(init(rngs.params(), (1, config.embed_len, e), dt))
        self.norm_pre = _layer_norm(config, dt, rngs) if config.pre_norm else None
        self.blocks = nnx.List([Block(config, rngs=rngs, param_dtype=dt)
                                for _ in range(config.depth)])
        self.norm = None if config.use_fc_norm else _layer_norm(config, dt, rngs)
        self.fc_norm = _layer_norm(config, dt, rngs) if config.use_fc_norm else None
        self.head = nnx.Linear(e, config.num_classes, param_dtype=dt, rngs=rngs)

    def _embed(self, x: jax.Array) -> jax.Array:
        """Prefix tokens and patch tokens, position embedding added (timm's `_pos_embed`)."""
        patches = self.patch_embed(x)
        n, e = x.shape[0], self.config.width
        prefix = [jnp.broadcast_to(t[...], (n, t.shape[1], e)).astype(patches.dtype)
                  for t in (self.cls_token, self.reg_token) if t is not None]
        if self.config.no_embed_class:
            return jnp.concatenate([*prefix, patches + self.pos_embed[...]], axis=1)
        return jnp.concatenate([*prefix, patches], axis=1) + self.pos_embed[...]

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        return self.forward_head(self.forward_features(x))

    def forward_features(self, x: jax.Array) -> jax.Array:
        """Every token after the blocks and the final `norm`, `(N, seq, width)` (timm's)."""
        return self.forward_intermediates(x, indices=1, output_fmt="NLC")[0]

    def forward_intermediates(
            self, x: jax.Array, indices: int | Sequence[int] | None = None,
            return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
            output_fmt: str = "NHWC", intermediates_only: bool = False) -> Any:
        """timm's: `(forward_features(x), taps)` or, `intermediates_only`, the taps: the
        tokens after each block (`norm`: with the final `norm`), the prefix tokens left out,
        the patches as a map in `output_fmt`: channels-last "NHWC" (the default), timm's
        "NCHW", or "NLC" (the tokens, `(N, patches, width)`). `indices`: the last n blocks
        (int), those listed, or all (None); `stop_early` skips the blocks after the last one
        taken; `return_prefix_tokens`: each tap is `(map, prefix tokens (N, prefix, width))`
        (when the model has any)."""
        take, last = take_indices(self.config.depth, indices)
        check_format(output_fmt, TOKENS)
        self.config.check_input(x.shape, channels_last=True)
        tokens = _apply(self.norm_pre, self._embed(x))
        taps = []
        for i, block in enumerate(self.blocks[:last + 1] if stop_early else self.blocks):
            tokens = block(tokens)
            if i in take:
                taps.append(_apply(self.norm, tokens) if norm else tokens)
        n = self.config.num_prefix_tokens
        maps = [t[:, n:] for t in taps]
        if output_fmt != "NLC":
            grid = (x.shape[0], *self.config.grid, self.config.width)
            maps = [t.reshape(grid).transpose(permutation("NHWC", output_fmt)) for t in maps]
        if return_prefix_tokens and n:
            maps = [(m, t[:, :n]) for m, t in zip(maps, taps, strict=True)]
        return maps if intermediates_only else (_apply(self.norm, tokens), maps)

    def reset_classifier(self, num_classes: int, *, rngs: nnx.Rngs) -> None:
        """A new `head` for `num_classes`, initialised by NNX (in place, as timm's; the config
        follows)."""
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        self.head = nnx.Linear(self.config.width, num_classes,
                                param_dtype=self.head.kernel.dtype, rngs=rngs)

    def forward_head(self, x: jax.Array, pre_logits: bool = False) -> jax.Array:
        """Logits of the tokens: pool (class token or patch average), `fc_norm`, `head`
        (`pre_logits`: before the head)."""
        pooled = (x[:, 0] if self.config.global_pool == "token"
                  else x[:, self.config.num_prefix_tokens:].mean(axis=1))
        pooled = _apply(self.fc_norm, pooled)
        return pooled if pre_logits else self.head(pooled)
