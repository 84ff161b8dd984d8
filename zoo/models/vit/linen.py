"""ViT in Flax Linen: batched `(N, H, W, C)` input, tokens `(N, seq, width)`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.layers.activations import gelu
from zoo.layers.attention import dot_product_attention
from zoo.layers.linen import LayerNorm, SelfAttention
from zoo.models.common import dtype_of
from zoo.models.intermediates import TOKENS, check_format, permutation, take_indices
from zoo.models.vit.config import ViTConfig


def _layer_norm(config: ViTConfig, dtype: jnp.dtype) -> LayerNorm:
    return LayerNorm(epsilon=config.norm_eps, param_dtype=dtype)


def _apply(layer: nn.Module | None, x: jax.Array) -> jax.Array:
    """`layer(x)` (None: the identity)."""
    return x if layer is None else layer(x)


class PatchEmbed(nn.Module):
    config: ViTConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        p = self.config.patch_size
        self.proj = nn.Conv(self.config.width, (p, p), strides=(p, p), padding="VALID",
                            use_bias=not self.config.pre_norm,
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
        return self.fc2(gelu(self.fc1(x)))


class LayerScale(nn.Module):
    """timm's LayerScale: a learned per-channel scale `gamma` (starts at `init_values`)."""

    init_values: float
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        gamma = self.param("gamma", nn.initializers.constant(self.init_values), (x.shape[-1],),
                           dtype_of(self.param_dtype))
        return x * gamma.reshape((1,) * (x.ndim - 1) + gamma.shape)  # explicit rank


class Block(nn.Module):
    config: ViTConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        scale = cfg.init_values is not None  # timm's order: norm1, attn, ls1, norm2, mlp, ls2
        self.norm1 = _layer_norm(cfg, dt)
        self.attn = SelfAttention(cfg.num_heads, param_dtype=dt, qkv_bias=cfg.qkv_bias,
                                  attention_fn=dot_product_attention)
        self.ls1 = LayerScale(cfg.init_values, self.param_dtype) if scale else None
        self.norm2 = _layer_norm(cfg, dt)
        self.mlp = Mlp(cfg, self.param_dtype)
        self.ls2 = LayerScale(cfg.init_values, self.param_dtype) if scale else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + _apply(self.ls1, self.attn(self.norm1(x)))
        return x + _apply(self.ls2, self.mlp(self.norm2(x)))


class ViT(nn.Module):
    config: ViTConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        init = nn.initializers.normal(0.02)
        e = cfg.width
        self.patch_embed = PatchEmbed(cfg, self.param_dtype)
        self.cls_token = self.param("cls_token", init, (1, 1, e), dt) if cfg.class_token else None
        self.reg_token = (self.param("reg_token", init, (1, cfg.reg_tokens, e), dt)
                          if cfg.reg_tokens else None)
        self.pos_embed = self.param("pos_embed", init, (1, cfg.embed_len, e), dt)
        self.norm_pre = _layer_norm(cfg, dt) if cfg.pre_norm else None
        self.blocks = [Block(cfg, self.param_dtype) for _ in range(cfg.depth)]
        self.norm = None if cfg.use_fc_norm else _layer_norm(cfg, dt)
        self.fc_norm = _layer_norm(cfg, dt) if cfg.use_fc_norm else None
        self.head = nn.Dense(cfg.num_classes, param_dtype=dt)

    def _embed(self, x: jax.Array) -> jax.Array:
        """Prefix tokens and patch tokens, position embedding added (timm's `_pos_embed`)."""
        patches = self.patch_embed(x)
        n, e = x.shape[0], self.config.width
        prefix = [jnp.broadcast_to(t, (n, t.shape[1], e)).astype(patches.dtype)
                  for t in (self.cls_token, self.reg_token) if t is not None]
        if self.config.no_embed_class:
            return jnp.concatenate([*prefix, patches + self.pos_embed], axis=1)
        return jnp.concatenate([*prefix, patches], axis=1) + self.pos_embed

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        return self.forward_head(self.forward_features(x))

    def forward_features(self, x: jax.Array) -> jax.Array:
        """Every token after the blocks and the final `norm`, `(N, seq, width)` (timm's); call
        it with `module.apply(variables, x, method="forward_features")`."""
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
        (when the model has any). Call it with `module.apply(variables, x,
        method="forward_intermediates", ...)`."""
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

    def reset_classifier(self, variables: Any, num_classes: int, *, key: jax.Array
                         ) -> tuple[nn.Module, Any]:
        """`(module, variables)` whose `head` is a fresh Flax Dense for `num_classes` (and
        whose config says so); this module and `variables` are not changed."""
        config = dataclasses.replace(self.config, num_classes=num_classes)
        dense = nn.Dense(num_classes, param_dtype=dtype_of(self.param_dtype), parent=None)
        new = dense.init(key, jnp.zeros((1, self.config.width), dtype_of(self.param_dtype)))
        params = {**variables["params"], "head": new["params"]}
        return self.clone(config=config), {**variables, "params": params}

    def forward_head(self, x: jax.Array, pre_logits: bool = False) -> jax.Array:
        """Logits of the tokens: pool (class token or patch average), `fc_norm`, `head`
        (`pre_logits`: before the head)."""
        pooled = (x[:, 0] if self.config.global_pool == "token"
                  else x[:, self.config.num_prefix_tokens:].mean(axis=1))
        pooled = _apply(self.fc_norm, pooled)
        return pooled if pre_logits else self.head(pooled)
