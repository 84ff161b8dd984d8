"""Swin Transformer in Equinox: per-sample `(C, H, W)` input, tokens `(H, W, C)` between the
layers (timm's channels-last maps), batched with vmap."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.activations import gelu
from zoo.layers.attention import dot_product_attention
from zoo.layers.drop_path import block_keys
from zoo.layers.eqx import EqxDropPath, LayerNorm, Linear, with_new_head
from zoo.models.common import dtype_of
from zoo.models.intermediates import MAPS, check_format, permutation, take_indices
from zoo.models.swin.config import (
    SwinConfig,
    attention_mask,
    merge_patches,
    padded,
    relative_position_index,
    window_partition,
    window_reverse,
)


def _layer_norm(config: SwinConfig, dim: int, dtype) -> LayerNorm:
    return LayerNorm(dim, eps=config.norm_eps, dtype=dtype)


def _tokenwise(layer: Callable[[Array], Array], x: Array) -> Array:
    """`layer` applied to every token of `(..., C)`."""
    y = jax.vmap(layer)(x.reshape(-1, x.shape[-1]))
    return y.reshape(*x.shape[:-1], y.shape[-1])


class PatchEmbed(eqx.Module):
    proj: eqx.nn.Conv2d  # kernel = stride = patch size
    norm: LayerNorm

    def __call__(self, x: Array) -> Array:  # (C, H, W) -> (h, w, E)
        return _tokenwise(self.norm, self.proj(x).transpose(1, 2, 0))


class WindowAttention(eqx.Module):
    """timm's `WindowAttention` over one image's windows `(windows, area, C)`: self-attention
    in each window plus the relative position bias of each head (the table is learned, its
    index derived from the window) and the shift mask."""

    relative_position_bias_table: Array  # ((2 wh - 1) * (2 ww - 1), heads)
    qkv: Linear
    proj: Linear
    num_heads: int = eqx.field(static=True)
    window: tuple[int, int] = eqx.field(static=True)

    def __init__(self, config: SwinConfig, dim: int, heads: int, window: tuple[int, int], *,
                 key: PRNGKeyArray, dtype=None) -> None:
        kt, kq, kp = jax.random.split(key, 3)
        size = (2 * window[0] - 1) * (2 * window[1] - 1)
        self.relative_position_bias_table = 0.02 * jax.random.normal(kt, (size, heads), dtype)
        self.qkv = Linear(dim, 3 * dim, use_bias=config.qkv_bias, key=kq, dtype=dtype)
        self.proj = Linear(dim, dim, key=kp, dtype=dtype)
        self.num_heads, self.window = heads, tuple(window)

    def __call__(self, x: Array, mask: Any = None) -> Array:
        w, n, c = x.shape
        q, k, v = (_tokenwise(self.qkv, x).reshape(w, n, 3, self.num_heads, -1)
                   .transpose(2, 0, 1, 3, 4))
        index = relative_position_index(self.window).reshape(-1)
        bias = self.relative_position_bias_table[index].reshape(n, n, -1).transpose(2, 0, 1)
        bias = bias[None] if mask is None else bias[None] + jnp.asarray(mask)[:, None]
        y = dot_product_attention(q, k, v, logits_bias=bias)
        return _tokenwise(self.proj, y.reshape(w, n, c))


class Mlp(eqx.Module):
    fc1: Linear
    fc2: Linear

    def __call__(self, x: Array) -> Array:  # one token
        return self.fc2(gelu(self.fc1(x)))


class SwinTransformerBlock(eqx.Module):
    norm1: LayerNorm
    attn: WindowAttention
    drop_path1: EqxDropPath
    norm2: LayerNorm
    mlp: Mlp
    drop_path2: EqxDropPath
    window: tuple[int, int] = eqx.field(static=True)
    shift: tuple[int, int] = eqx.field(static=True)

    def __init__(self, config: SwinConfig, stage: int, index: int, drop_path: float, *,
                 key: PRNGKeyArray, dtype=None) -> None:
        ka, k1, k2 = jax.random.split(key, 3)
        dim, hidden = config.stage_dim(stage), config.mlp_hidden(stage)
        self.window, self.shift = config.window(stage), config.block_shift(stage, index)
        self.norm1 = _layer_norm(config, dim, dtype)
        self.attn = WindowAttention(config, dim, config.num_heads[stage], self.window, key=ka,
                                    dtype=dtype)
        self.drop_path1 = EqxDropPath(drop_path)
        self.norm2 = _layer_norm(config, dim, dtype)
        self.mlp = Mlp(Linear(dim, hidden, key=k1, dtype=dtype),
                       Linear(hidden, dim, key=k2, dtype=dtype))
        self.drop_path2 = EqxDropPath(drop_path)

    def _attn(self, x: Array) -> Array:  # (H, W, C)
        h, w, _ = x.shape
        shifted = any(self.shift)
        if shifted:
            x = jnp.roll(x, (-self.shift[0], -self.shift[1]), axis=(0, 1))
        hp, wp = padded((h, w), self.window)
        x = jnp.pad(x, ((0, hp - h), (0, wp - w), (0, 0)))
        mask = attention_mask((hp, wp), self.window, self.shift)
        windows = self.attn(window_partition(x, self.window), mask)
        x = window_reverse(windows, self.window, (hp, wp))[:h, :w]
        return jnp.roll(x, self.shift, axis=(0, 1)) if shifted else x

    def __call__(self, x: Array, keys: tuple[Any, Any] = (None, None)) -> Array:
        x = x + self.drop_path1(self._attn(_tokenwise(self.norm1, x)), key=keys[0])
        y = _tokenwise(lambda t: self.mlp(self.norm2(t)), x)
        return x + self.drop_path2(y, key=keys[1])


class PatchMerging(eqx.Module):
    norm: LayerNorm
    reduction: Linear

    def __call__(self, x: Array) -> Array:  # (H, W, C) -> (H/2, W/2, 2C)
        return _tokenwise(lambda t: self.reduction(self.norm(t)), merge_patches(x))


class SwinTransformerStage(eqx.Module):
    downsample: PatchMerging | None
    blocks: tuple[SwinTransformerBlock, ...]

    def __init__(self, config: SwinConfig, stage: int, *, key: PRNGKeyArray, dtype=None
                 ) -> None:
        rates = config.drop_path_rates()[stage]
        kd, *kb = jax.random.split(key, 1 + len(rates))
        if stage:
            dim = config.stage_dim(stage - 1)
            self.downsample = PatchMerging(
                _layer_norm(config, 4 * dim, dtype),
                Linear(4 * dim, 2 * dim, use_bias=False, key=kd, dtype=dtype))
        else:
            self.downsample = None
        self.blocks = tuple(SwinTransformerBlock(config, stage, j, rate, key=k, dtype=dtype)
                            for j, (k, rate) in enumerate(zip(kb, rates, strict=True)))


class ClassifierHead(eqx.Module):
    fc: Linear | None  # None: num_classes 0


class Swin(eqx.Module):
    patch_embed: PatchEmbed
    layers: tuple[SwinTransformerStage, ...]
    norm: LayerNorm
    head: ClassifierHead
    config: SwinConfig = eqx.field(static=True)

    def __init__(self, config: SwinConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        dt = dtype_of(dtype)
        kp, kh, *ks = jax.random.split(key, 2 + config.num_stages)
        p = config.patch_size
        self.patch_embed = PatchEmbed(
            eqx.nn.Conv2d(config.in_channels, config.embed_dim, (p, p), (p, p), key=kp,
                          dtype=dt),
            _layer_norm(config, config.embed_dim, dt))
        self.layers = tuple(SwinTransformerStage(config, i, key=k, dtype=dt)
                            for i, k in enumerate(ks))
        self.norm = _layer_norm(config, config.num_features, dt)
        n = config.num_classes
        self.head = ClassifierHead(Linear(config.num_features, n, key=kh, dtype=dt) if n
                                   else None)
        self.config = config

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Logits of one image `x` of shape `(C, H, W)` (`key`: drop path's, in training)."""
        return self.forward_head(self.forward_features(x, key=key))

    def forward_features(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The last stage's map of one image after the final `norm`, `(H, W, C)`
        (channels-last, as timm's)."""
        return self.forward_intermediates(x, indices=1, key=key)[0]

    def forward_intermediates(
            self, x: Array, indices: int | Sequence[int] | None = None, norm: bool = False,
            stop_early: bool = False, output_fmt: str = "NCHW",
            intermediates_only: bool = False, *, key: PRNGKeyArray | None = None) -> Any:
        """timm's, per image: `(final features, taps)` or, `intermediates_only`, the taps:
        each stage's map (`norm`: the last one with the final `norm`), `(C, H, W)` for
        `output_fmt` "NCHW" (the default), `(H, W, C)` for "NHWC"; the final features are
        `forward_features`' (without the final `norm` when `stop_early` ends before the last
        stage). `indices`: the last n stages (int), those listed, or all (None). `key`: drop
        path's (training): the `b`-th block of the model draws with `block_keys(key, 2 * b)`
        and `block_keys(key, 2 * b + 1)`."""
        cfg = self.config
        take, last = take_indices(cfg.num_stages, indices)
        check_format(output_fmt, MAPS)
        cfg.check_input(x.shape, batched=False)
        x = self.patch_embed(x)
        stages = self.layers[:last + 1] if stop_early else self.layers
        taps, b = [], 0
        perm = permutation("NHWC", output_fmt, batched=False)
        for i, stage in enumerate(stages):
            if stage.downsample is not None:
                x = stage.downsample(x)
            for block in stage.blocks:
                keys = ((None, None) if key is None else
                        (block_keys(key, 2 * b), block_keys(key, 2 * b + 1)))
                x = block(x, keys)
                b += 1
            if i in take:
                tap = (_tokenwise(self.norm, x) if norm and i == cfg.num_stages - 1 else x)
                taps.append(tap.transpose(perm))
        if intermediates_only:
            return taps
        return (_tokenwise(self.norm, x) if len(stages) == cfg.num_stages else x), taps

    def reset_classifier(self, num_classes: int, *, key: PRNGKeyArray) -> Swin:
        """A new model whose `head.fc` is a fresh Equinox Linear for `num_classes` (none for 0)
        and whose config says so; this one is not changed."""
        new = with_new_head(self, "head", self.config.num_features, num_classes, key=key)
        object.__setattr__(new, "head", ClassifierHead(new.head))
        return new

    def forward_head(self, x: Array, pre_logits: bool = False) -> Array:
        """Logits of one image's final map `(H, W, C)`: the average pool and `head.fc`
        (`pre_logits`: before it)."""
        pooled = x.mean(axis=(0, 1))
        return pooled if pre_logits or self.head.fc is None else self.head.fc(pooled)
