"""ViT in Flax Linen: batched `(N, H, W, C)` input, tokens `(N, seq, width)`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.layers.attention import dot_product_attention
from zoo.layers.drop_path import block_keys
from zoo.layers.linen import LayerNorm, LinenDropPath, SelfAttention
from zoo.layers.pos_embed import resample_pos_embed
from zoo.models.common import activation, dtype_of
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
    """timm's `Mlp`, or its `SwiGLUPacked` (`gated`: `act(first half) * second half`)."""

    config: ViTConfig
    hidden: int
    gated: bool = False
    param_dtype: str = "float32"

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        self.fc1 = nn.Dense(self.hidden, param_dtype=dt)
        self.fc2 = nn.Dense(self.config.width, param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.fc1(x)
        act = activation(self.config.act_layer)
        if self.gated:
            x1, x2 = jnp.split(x, 2, axis=-1)
            return self.fc2(act(x1) * x2)
        return self.fc2(act(x))


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
    drop_path: float = 0.0
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        scale = cfg.init_values is not None  # timm's order: norm1, attn, ls1, norm2, mlp, ls2
        self.norm1 = _layer_norm(cfg, dt)
        self.attn = SelfAttention(cfg.num_heads, param_dtype=dt, qkv_bias=cfg.qkv_bias,
                                  attention_fn=dot_product_attention)
        self.ls1 = LayerScale(cfg.init_values, self.param_dtype) if scale else None
        self.drop_path1 = LinenDropPath(self.drop_path)
        self.norm2 = _layer_norm(cfg, dt)
        self.mlp = Mlp(cfg, cfg.mlp_hidden, cfg.mlp_layer == "swiglu_packed", self.param_dtype)
        self.ls2 = LayerScale(cfg.init_values, self.param_dtype) if scale else None
        self.drop_path2 = LinenDropPath(self.drop_path)

    def __call__(self, x: jax.Array, keys: tuple | None = None) -> jax.Array:
        """`keys`: the two drop paths' (one key per sample each), or None (eval)."""
        det = keys is None
        k1, k2 = (None, None) if det else keys
        x = x + self.drop_path1(_apply(self.ls1, self.attn(self.norm1(x))), det, key=k1)
        return x + self.drop_path2(_apply(self.ls2, self.mlp(self.norm2(x))), det, key=k2)


class AttentionPool(nn.Module):
    """timm's `AttentionPoolLatent` (`global_pool="map"`): the learned `latent` query
    (projected by `q`) attends to the tokens (projected by `kv`: keys, then values); `proj`,
    then a residual MLP after `norm`."""

    config: ViTConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        e = cfg.width
        self.latent = self.param("latent", nn.initializers.normal(0.02), (1, 1, e), dt)
        self.q = nn.Dense(e, param_dtype=dt)
        self.kv = nn.Dense(2 * e, param_dtype=dt)
        self.proj = nn.Dense(e, param_dtype=dt)
        self.norm = _layer_norm(cfg, dt)
        self.mlp = Mlp(cfg, cfg.pool_hidden, False, self.param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:  # (N, tokens, width) -> (N, width)
        n, t, e = x.shape
        h = self.config.num_heads
        q = jnp.broadcast_to(self.q(self.latent), (n, 1, e)).reshape(n, 1, h, -1)
        kv = self.kv(x).reshape(n, t, 2, h, -1)
        y = dot_product_attention(q, kv[:, :, 0], kv[:, :, 1]).reshape(n, e)
        y = self.proj(y)
        return y + self.mlp(self.norm(y))


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
        self.dist_token = (self.param("dist_token", init, (1, 1, e), dt) if cfg.distilled
                           else None)
        self.norm_pre = _layer_norm(cfg, dt) if cfg.pre_norm else None
        self.blocks = [Block(cfg, rate, self.param_dtype) for rate in cfg.drop_path_rates()]
        self.norm = None if cfg.use_fc_norm else _layer_norm(cfg, dt)
        self.attn_pool = (AttentionPool(cfg, self.param_dtype) if cfg.global_pool == "map"
                          else None)
        self.fc_norm = _layer_norm(cfg, dt) if cfg.use_fc_norm else None
        n = cfg.num_classes
        self.head = nn.Dense(n, param_dtype=dt) if n else None
        self.head_dist = nn.Dense(n, param_dtype=dt) if n and cfg.distilled else None

    def _embed(self, x: jax.Array) -> jax.Array:
        """Prefix tokens and patch tokens, position embedding added (timm's `_pos_embed`)."""
        patches = self.patch_embed(x)
        cfg = self.config
        n, e = x.shape[0], cfg.width
        prefix = [jnp.broadcast_to(t, (n, t.shape[1], e)).astype(patches.dtype)
                  for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        pos_embed = self.pos_embed
        if cfg.dynamic_img_size:
            pos_embed = resample_pos_embed(pos_embed, cfg.grid_of(x.shape[1:3]), cfg.grid,
                                           cfg.pos_prefix)
        if cfg.no_embed_class:
            return jnp.concatenate([*prefix, patches + pos_embed], axis=1)
        return jnp.concatenate([*prefix, patches], axis=1) + pos_embed

    def __call__(self, x: jax.Array, *, train: bool = False,
                 key: jax.Array | None = None) -> jax.Array:
        """Logits of a batch; in training with drop path, its masks come from `key` (the raw
        key draws the Equinox model's masks), or from the "dropout" stream when not given."""
        return self.forward_head(self.forward_features(x, train=train, key=key))

    def forward_features(self, x: jax.Array, *, train: bool = False,
                         key: jax.Array | None = None) -> jax.Array:
        """Every token after the blocks and the final `norm`, `(N, seq, width)` (timm's); call
        it with `module.apply(variables, x, method="forward_features")`."""
        return self.forward_intermediates(x, indices=1, output_fmt="NLC", train=train,
                                          key=key)[0]

    def forward_intermediates(
            self, x: jax.Array, indices: int | Sequence[int] | None = None,
            return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
            output_fmt: str = "NHWC", intermediates_only: bool = False, *,
            train: bool = False, key: jax.Array | None = None) -> Any:
        """timm's: `(forward_features(x), taps)` or, `intermediates_only`, the taps: the
        tokens after each block (`norm`: with the final `norm`), the prefix tokens left out,
        the patches as a map in `output_fmt`: channels-last "NHWC" (the default), timm's
        "NCHW", or "NLC" (the tokens, `(N, patches, width)`). `indices`: the last n blocks
        (int), those listed, or all (None); `stop_early` skips the blocks after the last one
        taken; `return_prefix_tokens`: each tap is `(map, prefix tokens (N, prefix, width))`
        (when the model has any). Call it with `module.apply(variables, x,
        method="forward_intermediates", ...)`. In training with drop path, sample `i`'s masks
        are drawn as the Equinox model's from `split(key, N)[i]` (`key`: the "dropout" stream's
        when not given)."""
        take, last = take_indices(self.config.depth, indices)
        check_format(output_fmt, TOKENS)
        self.config.check_input(x.shape, channels_last=True)
        samples = _sample_keys(self, x.shape[0], train, key)
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

    def reset_classifier(self, variables: Any, num_classes: int, *, key: jax.Array
                         ) -> tuple[nn.Module, Any]:
        """`(module, variables)` whose `head` (and DeiT's `head_dist`) is a fresh Flax Dense
        for `num_classes` (none for 0) and whose config says so; this module and `variables`
        are not changed."""
        config = dataclasses.replace(self.config, num_classes=num_classes)
        dt = dtype_of(self.param_dtype)
        params = {k: v for k, v in variables["params"].items() if k not in ("head", "head_dist")}
        names = ("head", "head_dist") if config.distilled else ("head",)
        for name, k in zip(names, jax.random.split(key, len(names)), strict=True):
            if num_classes:
                dense = nn.Dense(num_classes, param_dtype=dt, parent=None)
                params[name] = dense.init(k, jnp.zeros((1, config.width), dt))["params"]
        return self.clone(config=config), {**variables, "params": params}

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


def _sample_keys(module: nn.Module, batch: int, train: bool, key: jax.Array | None
                 ) -> jax.Array | None:
    """One drop-path key per sample (`split(key, N)`, as the Equinox interface hands out),
    or None when no block drops (eval, or a rate of 0)."""
    if not train or module.config.drop_path_rate == 0.0:
        return None
    if key is None:
        key = module.make_rng("dropout")
    return jax.random.split(key, batch)
