"""ViT in Flax NNX: batched `(N, H, W, C)` input, tokens `(N, seq, width)`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.attention import dot_product_attention
from zoo.layers.drop_path import block_keys
from zoo.layers.nnx import LayerNorm, MultiHeadAttention, NNXDropPath
from zoo.layers.pos_embed import resample_pos_embed
from zoo.models.common import activation, dtype_of
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
    """timm's `Mlp`, or its `SwiGLUPacked` (`gated`: `act(first half) * second half`)."""

    def __init__(self, config: ViTConfig, hidden: int, gated: bool, *, rngs: nnx.Rngs,
                 param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.act, self.gated = config.act_layer, gated
        self.fc1 = nnx.Linear(config.width, hidden, param_dtype=dt, rngs=rngs)
        self.fc2 = nnx.Linear(hidden // 2 if gated else hidden, config.width, param_dtype=dt,
                              rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.fc1(x)
        if self.gated:
            x1, x2 = jnp.split(x, 2, axis=-1)
            return self.fc2(activation(self.act)(x1) * x2)
        return self.fc2(activation(self.act)(x))


class LayerScale(nnx.Module):
    """timm's LayerScale: a learned per-channel scale `gamma` (starts at `init_values`)."""

    def __init__(self, width: int, init_values: float, dtype) -> None:
        self.gamma = nnx.Param(jnp.full((width,), init_values, dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        gamma = self.gamma[...]
        return x * gamma.reshape((1,) * (x.ndim - 1) + gamma.shape)  # explicit rank


class Block(nnx.Module):
    def __init__(self, config: ViTConfig, drop_path: float = 0.0, *, rngs: nnx.Rngs,
                 param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        scale = config.init_values is not None  # timm's order: norm1, attn, ls1, norm2, mlp, ls2
        self.norm1 = _layer_norm(config, dt, rngs)
        self.attn = MultiHeadAttention(
            config.num_heads, config.width, decode=False, param_dtype=dt,
            qkv_bias=config.qkv_bias, attention_fn=dot_product_attention, keep_rngs=False,
            rngs=rngs)
        self.ls1 = LayerScale(config.width, config.init_values, dt) if scale else None
        self.drop_path1 = NNXDropPath(drop_path)
        self.norm2 = _layer_norm(config, dt, rngs)
        self.mlp = Mlp(config, config.mlp_hidden, config.mlp_layer == "swiglu_packed",
                       rngs=rngs, param_dtype=dt)
        self.ls2 = LayerScale(config.width, config.init_values, dt) if scale else None
        self.drop_path2 = NNXDropPath(drop_path)

    def __call__(self, x: jax.Array, keys: tuple | None = None) -> jax.Array:
        """`keys`: the two drop paths' (one key per sample each) in training, else None."""
        k1, k2 = (None, None) if keys is None else keys
        x = x + self.drop_path1(_apply(self.ls1, self.attn(self.norm1(x))), rngs=k1)
        return x + self.drop_path2(_apply(self.ls2, self.mlp(self.norm2(x))), rngs=k2)


class AttentionPool(nnx.Module):
    """timm's `AttentionPoolLatent` (`global_pool="map"`): the learned `latent` query
    (projected by `q`) attends to the tokens (projected by `kv`: keys, then values); `proj`,
    then a residual MLP after `norm`."""

    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        e = config.width
        self.num_heads = config.num_heads
        self.latent = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, 1, e), dt))
        self.q = nnx.Linear(e, e, param_dtype=dt, rngs=rngs)
        self.kv = nnx.Linear(e, 2 * e, param_dtype=dt, rngs=rngs)
        self.proj = nnx.Linear(e, e, param_dtype=dt, rngs=rngs)
        self.norm = _layer_norm(config, dt, rngs)
        self.mlp = Mlp(config, config.pool_hidden, False, rngs=rngs, param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:  # (N, tokens, width) -> (N, width)
        n, t, e = x.shape
        h = self.num_heads
        q = jnp.broadcast_to(self.q(self.latent[...]), (n, 1, e)).reshape(n, 1, h, -1)
        kv = self.kv(x).reshape(n, t, 2, h, -1)
        y = dot_product_attention(q, kv[:, :, 0], kv[:, :, 1]).reshape(n, e)
        y = self.proj(y)
        return y + self.mlp(self.norm(y))


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
        self.dist_token = (nnx.Param(init(rngs.params(), (1, 1, e), dt)) if config.distilled
                           else None)
        self.norm_pre = _layer_norm(config, dt, rngs) if config.pre_norm else None
        self.blocks = nnx.List([Block(config, rate, rngs=rngs, param_dtype=dt)
                                for rate in config.drop_path_rates()])
        self.norm = None if config.use_fc_norm else _layer_norm(config, dt, rngs)
        self.attn_pool = (AttentionPool(config, rngs=rngs, param_dtype=dt)
                          if config.global_pool == "map" else None)
        self.fc_norm = _layer_norm(config, dt, rngs) if config.use_fc_norm else None
        self.head = self._head(rngs, dt)
        self.head_dist = self._head(rngs, dt) if config.distilled else None

    def _head(self, rngs: nnx.Rngs, dtype) -> nnx.Linear | None:
        """A classifier for `config.num_classes` (None for 0: the identity, as timm's)."""
        n = self.config.num_classes
        return nnx.Linear(self.config.width, n, param_dtype=dtype, rngs=rngs) if n else None

    def _embed(self, x: jax.Array) -> jax.Array:
        """Prefix tokens and patch tokens, position embedding added (timm's `_pos_embed`)."""
        patches = self.patch_embed(x)
        cfg = self.config
        n, e = x.shape[0], cfg.width
        prefix = [jnp.broadcast_to(t[...], (n, t.shape[1], e)).astype(patches.dtype)
                  for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        pos_embed = self.pos_embed[...]
        if cfg.dynamic_img_size:
            pos_embed = resample_pos_embed(pos_embed, cfg.grid_of(x.shape[1:3]), cfg.grid,
                                           cfg.pos_prefix)
        if cfg.no_embed_class:
            return jnp.concatenate([*prefix, patches + pos_embed], axis=1)
        return jnp.concatenate([*prefix, patches], axis=1) + pos_embed

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        """Logits of a batch; `rngs` (a key, or an `nnx.Rngs` with a "dropout" stream): drop
        path's in training."""
        return self.forward_head(self.forward_features(x, rngs=rngs))

    def forward_features(self, x: jax.Array, *, rngs: Any = None) -> jax.Array:
        """Every token after the blocks and the final `norm`, `(N, seq, width)` (timm's)."""
        return self.forward_intermediates(x, indices=1, output_fmt="NLC", rngs=rngs)[0]

    def forward_intermediates(
            self, x: jax.Array, indices: int | Sequence[int] | None = None,
            return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
            output_fmt: str = "NHWC", intermediates_only: bool = False, *,
            rngs: Any = None) -> Any:
        """timm's: `(forward_features(x), taps)` or, `intermediates_only`, the taps: the
        tokens after each block (`norm`: with the final `norm`), the prefix tokens left out,
        the patches as a map in `output_fmt`: channels-last "NHWC" (the default), timm's
        "NCHW", or "NLC" (the tokens, `(N, patches, width)`). `indices`: the last n blocks
        (int), those listed, or all (None); `stop_early` skips the blocks after the last one
        taken; `return_prefix_tokens`: each tap is `(map, prefix tokens (N, prefix, width))`
        (when the model has any). In training with drop path, sample `i`'s masks are drawn
        as the Equinox model's from `split(key, N)[i]` (`rngs`: the key, or an `nnx.Rngs`
        whose "dropout" stream gives it)."""
        take, last = take_indices(self.config.depth, indices)
        check_format(output_fmt, TOKENS)
        self.config.check_input(x.shape, channels_last=True)
        samples = _sample_keys(self, x.shape[0], rngs)
        tokens = _apply(self.norm_pre, self._embed(x))
        taps = []
        for i, block in enumerate(self.blocks[:last + 1] if stop_early else self.blocks):
            keys = None if samples is None else (block_keys(samples, 2 * i),
                                                 block_keys(samples, 2 * i + 1))
            tokens = block(tokens, keys)
            if i in take:
                taps.append(_apply(self.norm, tokens) if norm else tokens)
        n = self.config.num_prefix_tokens
        maps = [t[:, n:] for t in taps]
        if output_fmt != "NLC":
            grid = (x.shape[0], *self.config.grid_of(x.shape[1:3]), self.config.width)
            maps = [t.reshape(grid).transpose(permutation("NHWC", output_fmt)) for t in maps]
        if return_prefix_tokens and n:
            maps = [(m, t[:, :n]) for m, t in zip(maps, taps, strict=True)]
        return maps if intermediates_only else (_apply(self.norm, tokens), maps)

    def reset_classifier(self, num_classes: int, *, rngs: nnx.Rngs) -> None:
        """A new `head` (and DeiT's `head_dist`) for `num_classes` (none for 0), initialised
        by NNX (in place, as timm's; the config follows)."""
        dtype = self.pos_embed[...].dtype
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        self.head = self._head(rngs, dtype)
        if self.config.distilled:
            self.head_dist = self._head(rngs, dtype)

    def forward_head(self, x: jax.Array, pre_logits: bool = False) -> jax.Array:
        """Logits of the tokens: pool (class token, patch average or attention pool),
        `fc_norm`, `head` (`pre_logits`: before the head); DeiT's distilled model averages its
        two heads (and its two tokens before them)."""
        cfg = self.config
        if cfg.distilled:
            if pre_logits:
                return (x[:, 0] + x[:, 1]) / 2
            return (_apply(self.head, x[:, 0]) + _apply(self.head_dist, x[:, 1])) / 2
        patches = x[:, cfg.num_prefix_tokens:]
        if self.attn_pool is not None:
            pooled = self.attn_pool(patches)
        else:
            pooled = x[:, 0] if cfg.global_pool == "token" else patches.mean(axis=1)
        pooled = _apply(self.fc_norm, pooled)
        return pooled if pre_logits else _apply(self.head, pooled)


def _sample_keys(model: ViT, batch: int, rngs: Any) -> jax.Array | None:
    """One drop-path key per sample (`split(key, N)`, as the Equinox interface hands out),
    or None when no block drops (eval mode, or a rate of 0)."""
    blocks = list(model.blocks)
    if model.config.drop_path_rate == 0.0 or not blocks or blocks[-1].drop_path2.deterministic:
        return None
    if isinstance(rngs, nnx.Rngs):
        rngs = rngs["dropout"]()
    if rngs is None:
        raise RuntimeError("the NNX ViT needs rngs in training with drop_path_rate > 0: a key "
                           "or an nnx.Rngs with a 'dropout' stream")
    return jax.random.split(rngs, batch)
