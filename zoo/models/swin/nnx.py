"""Swin Transformer in Flax NNX: batched `(N, H, W, C)` input and maps."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.activations import gelu
from zoo.layers.attention import dot_product_attention
from zoo.layers.drop_path import block_keys
from zoo.layers.nnx import LayerNorm, NNXDropPath
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


def _layer_norm(config: SwinConfig, dim: int, dtype: Any, rngs: nnx.Rngs) -> LayerNorm:
    return LayerNorm(dim, epsilon=config.norm_eps, param_dtype=dtype, rngs=rngs)


class PatchEmbed(nnx.Module):
    def __init__(self, config: SwinConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        p = config.patch_size
        self.proj = nnx.Conv(config.in_channels, config.embed_dim, (p, p), strides=(p, p),
                             padding="VALID", param_dtype=dt, rngs=rngs)
        self.norm = _layer_norm(config, config.embed_dim, dt, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.norm(self.proj(x))


class WindowAttention(nnx.Module):
    """timm's `WindowAttention` over `(N, windows, area, C)`: self-attention in each window
    plus the relative position bias of each head (the table is learned, its index derived
    from the window) and the shift mask."""

    def __init__(self, config: SwinConfig, dim: int, heads: int, window: tuple[int, int], *,
                 rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        size = (2 * window[0] - 1) * (2 * window[1] - 1)
        self.num_heads, self.window = heads, tuple(window)
        self.relative_position_bias_table = nnx.Param(
            nnx.initializers.normal(0.02)(rngs.params(), (size, heads), dt))
        self.qkv = nnx.Linear(dim, 3 * dim, use_bias=config.qkv_bias, param_dtype=dt,
                              rngs=rngs)
        self.proj = nnx.Linear(dim, dim, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array, mask: Any = None) -> jax.Array:
        *lead, n, c = x.shape
        qkv = self.qkv(x).reshape(*lead, n, 3, self.num_heads, -1)
        q, k, v = (qkv[..., i, :, :] for i in range(3))
        index = relative_position_index(self.window).reshape(-1)
        table = self.relative_position_bias_table[...]
        bias = table[index].reshape(n, n, -1).transpose(2, 0, 1)
        bias = bias[None] if mask is None else bias[None] + jnp.asarray(mask)[:, None]
        y = dot_product_attention(q, k, v, logits_bias=bias)
        return self.proj(y.reshape(*lead, n, c))


class Mlp(nnx.Module):
    def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.fc1 = nnx.Linear(dim, hidden, param_dtype=dt, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, dim, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(gelu(self.fc1(x)))


class SwinTransformerBlock(nnx.Module):
    def __init__(self, config: SwinConfig, stage: int, index: int, drop_path: float, *,
                 rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        dim = config.stage_dim(stage)
        self.window, self.shift = config.window(stage), config.block_shift(stage, index)
        self.norm1 = _layer_norm(config, dim, dt, rngs)
        self.attn = WindowAttention(config, dim, config.num_heads[stage], self.window,
                                    rngs=rngs, param_dtype=dt)
        self.drop_path1 = NNXDropPath(drop_path)
        self.norm2 = _layer_norm(config, dim, dt, rngs)
        self.mlp = Mlp(dim, config.mlp_hidden(stage), rngs=rngs, param_dtype=dt)
        self.drop_path2 = NNXDropPath(drop_path)

    def _attn(self, x: jax.Array) -> jax.Array:  # (N, H, W, C)
        window, shift = self.window, self.shift
        _, h, w, _ = x.shape
        if any(shift):
            x = jnp.roll(x, (-shift[0], -shift[1]), axis=(1, 2))
        hp, wp = padded((h, w), window)
        x = jnp.pad(x, ((0, 0), (0, hp - h), (0, wp - w), (0, 0)))
        windows = self.attn(window_partition(x, window),
                            attention_mask((hp, wp), window, shift))
        x = window_reverse(windows, window, (hp, wp))[:, :h, :w]
        return jnp.roll(x, shift, axis=(1, 2)) if any(shift) else x

    def __call__(self, x: jax.Array, keys: tuple | None = None) -> jax.Array:
        """`keys`: the two drop paths' (one key per sample each) in training, else None."""
        k1, k2 = (None, None) if keys is None else keys
        x = x + self.drop_path1(self._attn(self.norm1(x)), rngs=k1)
        return x + self.drop_path2(self.mlp(self.norm2(x)), rngs=k2)


class PatchMerging(nnx.Module):
    def __init__(self, config: SwinConfig, dim: int, *, rngs: nnx.Rngs,
                 param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.norm = _layer_norm(config, 4 * dim, dt, rngs)
        self.reduction = nnx.Linear(4 * dim, 2 * dim, use_bias=False, param_dtype=dt,
                                    rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.reduction(self.norm(merge_patches(x)))


class SwinTransformerStage(nnx.Module):
    def __init__(self, config: SwinConfig, stage: int, *, rngs: nnx.Rngs,
                 param_dtype=None) -> None:
        self.downsample = (PatchMerging(config, config.stage_dim(stage - 1), rngs=rngs,
                                        param_dtype=param_dtype) if stage else None)
        self.blocks = nnx.List([
            SwinTransformerBlock(config, stage, j, rate, rngs=rngs, param_dtype=param_dtype)
            for j, rate in enumerate(config.drop_path_rates()[stage])])

    def __call__(self, x: jax.Array, keys: list | None = None) -> jax.Array:
        if self.downsample is not None:
            x = self.downsample(x)
        for j, block in enumerate(self.blocks):
            x = block(x, None if keys is None else keys[j])
        return x


class ClassifierHead(nnx.Module):
    def __init__(self, config: SwinConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        n = config.num_classes
        self.fc = (nnx.Linear(config.num_features, n, param_dtype=dtype_of(param_dtype),
                              rngs=rngs) if n else None)

    def __call__(self, x: jax.Array, pre_logits: bool = False) -> jax.Array:
        pooled = x.mean(axis=(1, 2))
        return pooled if pre_logits or self.fc is None else self.fc(pooled)


class Swin(nnx.Module):
    def __init__(self, config: SwinConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.config = config
        self.patch_embed = PatchEmbed(config, rngs=rngs, param_dtype=dt)
        self.layers = nnx.List([SwinTransformerStage(config, i, rngs=rngs, param_dtype=dt)
                                for i in range(config.num_stages)])
        self.norm = _layer_norm(config, config.num_features, dt, rngs)
        self.head = ClassifierHead(config, rngs=rngs, param_dtype=dt)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        """Logits of a batch; `rngs` (a key, or an `nnx.Rngs` with a "dropout" stream): drop
        path's in training."""
        return self.forward_head(self.forward_features(x, rngs=rngs))

    def forward_features(self, x: jax.Array, *, rngs: Any = None) -> jax.Array:
        """The last stage's map after the final `norm`, `(N, H, W, C)` (timm's)."""
        return self.forward_intermediates(x, indices=1, rngs=rngs)[0]

    def forward_intermediates(
            self, x: jax.Array, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NHWC",
            intermediates_only: bool = False, *, rngs: Any = None) -> Any:
        """timm's: `(final features, taps)` or, `intermediates_only`, the taps: each stage's
        map (`norm`: the last one with the final `norm`) in `output_fmt`, channels-last
        "NHWC" (the default) or timm's "NCHW"; the final features are `forward_features`'
        (without the final `norm` when `stop_early` ends before the last stage). `indices`:
        the last n stages (int), those listed, or all (None). In training with drop path,
        sample `i`'s masks are drawn as the Equinox model's from `split(key, N)[i]` (`rngs`:
        the key, or an `nnx.Rngs` whose "dropout" stream gives it)."""
        cfg = self.config
        take, last = take_indices(cfg.num_stages, indices)
        check_format(output_fmt, MAPS)
        cfg.check_input(x.shape, channels_last=True)
        samples = _sample_keys(self, x.shape[0], rngs)
        x = self.patch_embed(x)
        stages = list(self.layers)[:last + 1] if stop_early else list(self.layers)
        taps, b = [], 0
        for i, stage in enumerate(stages):
            keys = None
            if samples is not None:
                keys = [(block_keys(samples, 2 * (b + j)), block_keys(samples, 2 * (b + j) + 1))
                        for j in range(cfg.depths[i])]
            x = stage(x, keys)
            b += cfg.depths[i]
            if i in take:
                tap = self.norm(x) if norm and i == cfg.num_stages - 1 else x
                taps.append(tap.transpose(permutation("NHWC", output_fmt)))
        if intermediates_only:
            return taps
        return (self.norm(x) if len(stages) == cfg.num_stages else x), taps

    def reset_classifier(self, num_classes: int, *, rngs: nnx.Rngs) -> None:
        """A new `head.fc` for `num_classes` (none for 0), initialised by NNX (in place, as
        timm's; the config follows)."""
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        self.head = ClassifierHead(self.config, rngs=rngs, param_dtype=self.norm.scale.dtype)

    def forward_head(self, x: jax.Array, pre_logits: bool = False) -> jax.Array:
        """Logits of the final map `(N, H, W, C)`: the average pool and `head.fc`
        (`pre_logits`: before it)."""
        return self.head(x, pre_logits=pre_logits)


def _sample_keys(model: Swin, batch: int, rngs: Any) -> jax.Array | None:
    """One drop-path key per sample (`split(key, N)`, as the Equinox interface hands out),
    or None when no block drops (eval mode, or a rate of 0)."""
    last = list(list(model.layers)[-1].blocks)[-1]
    if model.config.drop_path_rate == 0.0 or last.drop_path2.deterministic:
        return None
    if isinstance(rngs, nnx.Rngs):
        rngs = rngs["dropout"]()
    if rngs is None:
        raise RuntimeError("the NNX Swin needs rngs in training with drop_path_rate > 0: a key "
                           "or an nnx.Rngs with a 'dropout' stream")
    return jax.random.split(rngs, batch)
