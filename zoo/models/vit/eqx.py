"""ViT in Equinox: per-sample `(C, H, W)` input, tokens `(seq, width)`, batched with vmap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.attention import dot_product_attention
from zoo.layers.drop_path import block_keys
from zoo.layers.eqx import EqxDropPath, LayerNorm, Linear, MultiheadAttention, with_new_head
from zoo.layers.pos_embed import resample_pos_embed
from zoo.models.common import activation, dtype_of
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
    """timm's `Mlp`, or its `SwiGLUPacked` (`gated`: `act(first half) * second half`)."""

    fc1: Linear
    fc2: Linear
    act: str = eqx.field(static=True)
    gated: bool = eqx.field(static=True)

    def __init__(self, config: ViTConfig, hidden: int, gated: bool, *, key: PRNGKeyArray,
                 dtype=None) -> None:
        k1, k2 = jax.random.split(key)
        self.fc1 = Linear(config.width, hidden, key=k1, dtype=dtype)
        self.fc2 = Linear(hidden // 2 if gated else hidden, config.width, key=k2, dtype=dtype)
        self.act, self.gated = config.act_layer, gated

    def __call__(self, x: Array) -> Array:  # one token
        x = self.fc1(x)
        if self.gated:
            x1, x2 = jnp.split(x, 2, axis=-1)
            return self.fc2(activation(self.act)(x1) * x2)
        return self.fc2(activation(self.act)(x))


class LayerScale(eqx.Module):
    """timm's LayerScale: a learned per-channel scale `gamma` (starts at `init_values`)."""

    gamma: Array

    def __call__(self, x: Array) -> Array:
        return x * self.gamma


class Block(eqx.Module):
    norm1: LayerNorm
    attn: MultiheadAttention
    ls1: LayerScale | None
    drop_path1: EqxDropPath
    norm2: LayerNorm
    mlp: Mlp
    ls2: LayerScale | None
    drop_path2: EqxDropPath

    def __init__(self, config: ViTConfig, drop_path: float = 0.0, *, key: PRNGKeyArray,
                 dtype=None) -> None:
        k1, k2 = jax.random.split(key)
        e, qkv_bias = config.width, config.qkv_bias
        self.norm1 = _layer_norm(config, dtype)
        self.attn = MultiheadAttention(
            config.num_heads, e, use_query_bias=qkv_bias, use_key_bias=qkv_bias,
            use_value_bias=qkv_bias, use_output_bias=True, dtype=dtype, key=k1)
        self.norm2 = _layer_norm(config, dtype)
        self.mlp = Mlp(config, config.mlp_hidden, config.mlp_layer == "swiglu_packed", key=k2,
                       dtype=dtype)
        self.ls1, self.ls2 = (
            [LayerScale(jnp.full((e,), config.init_values, dtype)) for _ in range(2)]
            if config.init_values is not None else (None, None))
        self.drop_path1, self.drop_path2 = EqxDropPath(drop_path), EqxDropPath(drop_path)

    def __call__(self, x: Array, keys: tuple[Any, Any] = (None, None)) -> Array:
        """One image's tokens `(seq, width)`; `keys`: the two drop paths' (training)."""
        y = _tokenwise(self.norm1, x)
        x = x + self.drop_path1(_tokenwise(self.ls1, self.attn(y, y, y)), key=keys[0])
        y = _tokenwise(self.ls2, jax.vmap(lambda t: self.mlp(self.norm2(t)))(x))
        return x + self.drop_path2(y, key=keys[1])


class AttentionPool(eqx.Module):
    """timm's `AttentionPoolLatent` (`global_pool="map"`) for one image: the learned `latent`
    query (projected by `q`) attends to the tokens (projected by `kv`: keys, then values);
    `proj`, then a residual MLP after `norm`."""

    latent: Array  # (1, 1, width)
    q: Linear
    kv: Linear
    proj: Linear
    norm: LayerNorm
    mlp: Mlp
    num_heads: int = eqx.field(static=True)

    def __init__(self, config: ViTConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        kl, kq, kkv, kp, km = jax.random.split(key, 5)
        e = config.width
        self.latent = 0.02 * jax.random.normal(kl, (1, 1, e), dtype)
        self.q = Linear(e, e, key=kq, dtype=dtype)
        self.kv = Linear(e, 2 * e, key=kkv, dtype=dtype)
        self.proj = Linear(e, e, key=kp, dtype=dtype)
        self.norm = _layer_norm(config, dtype)
        self.mlp = Mlp(config, config.pool_hidden, False, key=km, dtype=dtype)
        self.num_heads = config.num_heads

    def __call__(self, x: Array) -> Array:  # (tokens, width) -> (width,)
        h, e = self.num_heads, x.shape[-1]
        q = self.q(self.latent[0, 0]).reshape(1, h, -1)
        kv = jax.vmap(self.kv)(x).reshape(x.shape[0], 2, h, -1)
        y = dot_product_attention(q, kv[:, 0], kv[:, 1]).reshape(e)
        y = self.proj(y)
        return y + self.mlp(self.norm(y))


class ViT(eqx.Module):
    patch_embed: PatchEmbed
    cls_token: Array | None  # (1, 1, width), as timm
    reg_token: Array | None  # (1, reg_tokens, width)
    pos_embed: Array  # (1, embed_len, width)
    dist_token: Array | None  # DeiT's (1, 1, width)
    norm_pre: LayerNorm | None
    blocks: tuple[Block, ...]
    norm: LayerNorm | None
    attn_pool: AttentionPool | None
    fc_norm: LayerNorm | None
    head: Linear | None  # None: num_classes 0
    head_dist: Linear | None
    config: ViTConfig = eqx.field(static=True)

    def __init__(self, config: ViTConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        dt = dtype_of(dtype)
        kp, kc, kr, kpos, kh, kd, kdh, ka, *kb = jax.random.split(key, 8 + config.depth)
        p, e = config.patch_size, config.width
        self.patch_embed = PatchEmbed(eqx.nn.Conv2d(config.in_channels, e, (p, p), (p, p),
                                                    use_bias=not config.pre_norm, key=kp,
                                                    dtype=dt))
        self.cls_token = (0.02 * jax.random.normal(kc, (1, 1, e), dt)
                          if config.class_token else None)
        self.reg_token = (0.02 * jax.random.normal(kr, (1, config.reg_tokens, e), dt)
                          if config.reg_tokens else None)
        self.pos_embed = 0.02 * jax.random.normal(kpos, (1, config.embed_len, e), dt)
        self.dist_token = (0.02 * jax.random.normal(kd, (1, 1, e), dt) if config.distilled
                           else None)
        self.norm_pre = _layer_norm(config, dt) if config.pre_norm else None
        self.blocks = tuple(Block(config, rate, key=k, dtype=dt)
                            for k, rate in zip(kb, config.drop_path_rates(), strict=True))
        self.norm = None if config.use_fc_norm else _layer_norm(config, dt)
        self.attn_pool = (AttentionPool(config, key=ka, dtype=dt)
                          if config.global_pool == "map" else None)
        self.fc_norm = _layer_norm(config, dt) if config.use_fc_norm else None
        n = config.num_classes
        self.head = Linear(e, n, key=kh, dtype=dt) if n else None
        self.head_dist = Linear(e, n, key=kdh, dtype=dt) if n and config.distilled else None
        self.config = config

    def _embed(self, x: Array) -> Array:
        """Prefix tokens and patch tokens, position embedding added (timm's `_pos_embed`)."""
        patches = self.patch_embed(x)
        prefix = [t[0] for t in (self.cls_token, self.dist_token, self.reg_token)
                  if t is not None]
        cfg = self.config
        pos_embed = self.pos_embed
        if cfg.dynamic_img_size:
            pos_embed = resample_pos_embed(pos_embed, cfg.grid_of(x.shape[1:]), cfg.grid,
                                           cfg.pos_prefix)
        if cfg.no_embed_class:
            return jnp.concatenate([*prefix, patches + pos_embed[0]])
        return jnp.concatenate([*prefix, patches]) + pos_embed[0]

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Logits of one image `x` of shape `(C, H, W)` (`key`: drop path's, in training)."""
        return self.forward_head(self.forward_features(x, key=key))

    def forward_features(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Every token of one image after the blocks and the final `norm`, `(seq, width)`
        (timm's)."""
        return self.forward_intermediates(x, indices=1, output_fmt="NLC", key=key)[0]

    def forward_intermediates(
            self, x: Array, indices: int | Sequence[int] | None = None,
            return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
            output_fmt: str = "NCHW", intermediates_only: bool = False, *,
            key: PRNGKeyArray | None = None) -> Any:
        """timm's, per image: `(forward_features(x), taps)` or, `intermediates_only`, the
        taps: the tokens after each block (`norm`: with the final `norm`), the prefix tokens
        left out, the patches as a map: `(C, H, W)` for `output_fmt` "NCHW" (the default),
        `(H, W, C)` for "NHWC", the tokens `(patches, width)` for "NLC". `indices`: the last
        n blocks (int), those listed, or all (None); `stop_early` skips the blocks after the
        last one taken; `return_prefix_tokens`: each tap is `(map, prefix tokens (prefix,
        width))` (when the model has any). `key`: drop path's (training); block `i`'s two
        drop paths draw with `block_keys(key, 2 * i)` and `block_keys(key, 2 * i + 1)`."""
        take, last = take_indices(self.config.depth, indices)
        check_format(output_fmt, TOKENS)
        self.config.check_input(x.shape, batched=False)
        tokens = _tokenwise(self.norm_pre, self._embed(x))
        taps = []
        for i, block in enumerate(self.blocks[:last + 1] if stop_early else self.blocks):
            keys = ((None, None) if key is None else
                    (block_keys(key, 2 * i), block_keys(key, 2 * i + 1)))
            tokens = block(tokens, keys)
            if i in take:
                taps.append(_tokenwise(self.norm, tokens) if norm else tokens)
        n = self.config.num_prefix_tokens
        maps = [t[n:] for t in taps]
        if output_fmt != "NLC":
            grid = (*self.config.grid_of(x.shape[1:]), self.config.width)
            perm = permutation("NHWC", output_fmt, batched=False)
            maps = [t.reshape(grid).transpose(perm) for t in maps]
        if return_prefix_tokens and n:
            maps = [(m, t[:n]) for m, t in zip(maps, taps, strict=True)]
        return maps if intermediates_only else (_tokenwise(self.norm, tokens), maps)

    def reset_classifier(self, num_classes: int, *, key: PRNGKeyArray) -> ViT:
        """A new model whose `head` (and DeiT's `head_dist`) is a fresh Equinox Linear for
        `num_classes` (None for 0) and whose config says so; this one is not changed."""
        e = self.config.width
        k1, k2 = jax.random.split(key)
        new = with_new_head(self, "head", e, num_classes, key=k1)
        if self.config.distilled:
            new = with_new_head(new, "head_dist", e, num_classes, key=k2)
        return new

    def forward_head(self, x: Array, pre_logits: bool = False) -> Array:
        """Logits of one image's tokens: pool (class token, patch average or attention pool),
        `fc_norm`, `head` (`pre_logits`: before the head); DeiT's distilled model averages its
        two heads (and its two tokens before them)."""
        cfg = self.config
        if cfg.distilled:
            if pre_logits:
                return (x[0] + x[1]) / 2
            return (_head(self.head, x[0]) + _head(self.head_dist, x[1])) / 2
        patches = x[cfg.num_prefix_tokens:]
        if self.attn_pool is not None:
            pooled = self.attn_pool(patches)
        else:
            pooled = x[0] if cfg.global_pool == "token" else patches.mean(axis=0)
        pooled = pooled if self.fc_norm is None else self.fc_norm(pooled)
        return pooled if pre_logits else _head(self.head, pooled)


def _head(head: Linear | None, x: Array) -> Array:
    """A classifier (None: the identity, timm's head for 0 classes)."""
    return x if head is None else head(x)
