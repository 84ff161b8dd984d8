"""Swin Transformer in Flax Linen: batched `(N, H, W, C)` input and maps."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.layers.activations import gelu
from zoo.layers.attention import dot_product_attention
from zoo.layers.drop_path import block_keys
from zoo.layers.linen import LayerNorm, LinenDropPath
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


def _layer_norm(config: SwinConfig, dtype: Any) -> LayerNorm:
    return LayerNorm(epsilon=config.norm_eps, param_dtype=dtype)


class PatchEmbed(nn.Module):
    config: SwinConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        p = cfg.patch_size
        self.proj = nn.Conv(cfg.embed_dim, (p, p), strides=(p, p), padding="VALID",
                            param_dtype=dt)
        self.norm = _layer_norm(cfg, dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.norm(self.proj(x))


class WindowAttention(nn.Module):
    """timm's `WindowAttention` over `(N, windows, area, C)`: self-attention in each window
    plus the relative position bias of each head (the table is learned, its index derived
    from the window) and the shift mask."""

    config: SwinConfig
    dim: int
    num_heads: int
    window: tuple[int, int]
    param_dtype: str = "float32"

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        size = (2 * self.window[0] - 1) * (2 * self.window[1] - 1)
        self.relative_position_bias_table = self.param(
            "relative_position_bias_table", nn.initializers.normal(0.02),
            (size, self.num_heads), dt)
        self.qkv = nn.Dense(3 * self.dim, use_bias=self.config.qkv_bias, param_dtype=dt)
        self.proj = nn.Dense(self.dim, param_dtype=dt)

    def __call__(self, x: jax.Array, mask: Any = None) -> jax.Array:
        *lead, n, c = x.shape
        qkv = self.qkv(x).reshape(*lead, n, 3, self.num_heads, -1)
        q, k, v = (qkv[..., i, :, :] for i in range(3))
        index = relative_position_index(tuple(self.window)).reshape(-1)
        bias = self.relative_position_bias_table[index].reshape(n, n, -1).transpose(2, 0, 1)
        bias = bias[None] if mask is None else bias[None] + jnp.asarray(mask)[:, None]
        y = dot_product_attention(q, k, v, logits_bias=bias)
        return self.proj(y.reshape(*lead, n, c))


class Mlp(nn.Module):
    dim: int
    hidden: int
    param_dtype: str = "float32"

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        self.fc1 = nn.Dense(self.hidden, param_dtype=dt)
        self.fc2 = nn.Dense(self.dim, param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(gelu(self.fc1(x)))


class SwinTransformerBlock(nn.Module):
    config: SwinConfig
    stage: int
    index: int
    drop_path: float = 0.0
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt, i = self.config, dtype_of(self.param_dtype), self.stage
        dim = cfg.stage_dim(i)
        self.norm1 = _layer_norm(cfg, dt)
        self.attn = WindowAttention(cfg, dim, cfg.num_heads[i], cfg.window(i), self.param_dtype)
        self.drop_path1 = LinenDropPath(self.drop_path)
        self.norm2 = _layer_norm(cfg, dt)
        self.mlp = Mlp(dim, cfg.mlp_hidden(i), self.param_dtype)
        self.drop_path2 = LinenDropPath(self.drop_path)

    def _attn(self, x: jax.Array) -> jax.Array:  # (N, H, W, C)
        window = self.config.window(self.stage)
        shift = self.config.block_shift(self.stage, self.index)
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
        det = keys is None
        k1, k2 = (None, None) if det else keys
        x = x + self.drop_path1(self._attn(self.norm1(x)), det, key=k1)
        return x + self.drop_path2(self.mlp(self.norm2(x)), det, key=k2)


class PatchMerging(nn.Module):
    config: SwinConfig
    dim: int
    param_dtype: str = "float32"

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        self.norm = _layer_norm(self.config, dt)
        self.reduction = nn.Dense(2 * self.dim, use_bias=False, param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.reduction(self.norm(merge_patches(x)))


class SwinTransformerStage(nn.Module):
    config: SwinConfig
    stage: int
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, i = self.config, self.stage
        self.downsample = (PatchMerging(cfg, cfg.stage_dim(i - 1), self.param_dtype) if i
                           else None)
        self.blocks = [SwinTransformerBlock(cfg, i, j, rate, self.param_dtype)
                       for j, rate in enumerate(cfg.drop_path_rates()[i])]

    def __call__(self, x: jax.Array, keys: list | None = None) -> jax.Array:
        if self.downsample is not None:
            x = self.downsample(x)
        for j, block in enumerate(self.blocks):
            x = block(x, None if keys is None else keys[j])
        return x


class ClassifierHead(nn.Module):
    config: SwinConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        n = self.config.num_classes
        self.fc = nn.Dense(n, param_dtype=dtype_of(self.param_dtype)) if n else None

    def __call__(self, x: jax.Array, pre_logits: bool = False) -> jax.Array:
        pooled = x.mean(axis=(1, 2))
        return pooled if pre_logits or self.fc is None else self.fc(pooled)


class Swin(nn.Module):
    config: SwinConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg = self.config
        self.patch_embed = PatchEmbed(cfg, self.param_dtype)
        self.layers = [SwinTransformerStage(cfg, i, self.param_dtype)
                       for i in range(cfg.num_stages)]
        self.norm = _layer_norm(cfg, dtype_of(self.param_dtype))
        self.head = ClassifierHead(cfg, self.param_dtype)

    def __call__(self, x: jax.Array, *, train: bool = False,
                 key: jax.Array | None = None) -> jax.Array:
        """Logits of a batch; in training with drop path, its masks come from `key` (or from
        the "dropout" stream)."""
        return self.forward_head(self.forward_features(x, train=train, key=key))

    def forward_features(self, x: jax.Array, *, train: bool = False,
                         key: jax.Array | None = None) -> jax.Array:
        """The last stage's map after the final `norm`, `(N, H, W, C)` (timm's); call it with
        `module.apply(variables, x, method="forward_features")`."""
        return self.forward_intermediates(x, indices=1, train=train, key=key)[0]

    def forward_intermediates(
            self, x: jax.Array, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NHWC",
            intermediates_only: bool = False, *, train: bool = False,
            key: jax.Array | None = None) -> Any:
        """timm's: `(final features, taps)` or, `intermediates_only`, the taps: each stage's
        map (`norm`: the last one with the final `norm`) in `output_fmt`, channels-last
        "NHWC" (the default) or timm's "NCHW"; the final features are `forward_features`'
        (without the final `norm` when `stop_early` ends before the last stage). `indices`:
        the last n stages (int), those listed, or all (None). In training with drop path,
        sample `i`'s masks are drawn as the Equinox model's from `split(key, N)[i]`."""
        cfg = self.config
        take, last = take_indices(cfg.num_stages, indices)
        check_format(output_fmt, MAPS)
        cfg.check_input(x.shape, channels_last=True)
        samples = None
        if train and cfg.drop_path_rate > 0.0:
            samples = jax.random.split(self.make_rng("dropout") if key is None else key,
                                       x.shape[0])
        x = self.patch_embed(x)
        stages = self.layers[:last + 1] if stop_early else self.layers
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

    def reset_classifier(self, variables: Any, num_classes: int, *, key: jax.Array
                         ) -> tuple[nn.Module, Any]:
        """`(module, variables)` whose `head.fc` is a fresh Flax Dense for `num_classes` (none
        for 0) and whose config says so; this module and `variables` are not changed."""
        config = dataclasses.replace(self.config, num_classes=num_classes)
        dt = dtype_of(self.param_dtype)
        params = {k: v for k, v in variables["params"].items() if k != "head"}
        if num_classes:
            dense = nn.Dense(num_classes, param_dtype=dt, parent=None)
            params["head"] = {"fc": dense.init(key, jnp.zeros((1, config.num_features),
                                                             dt))["params"]}
        return self.clone(config=config), {**variables, "params": params}

    def forward_head(self, x: jax.Array, pre_logits: bool = False) -> jax.Array:
        """Logits of the final map `(N, H, W, C)`: the average pool and `head.fc`
        (`pre_logits`: before it)."""
        return self.head(x, pre_logits=pre_logits)
