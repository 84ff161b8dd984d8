"""ConvNeXt in Equinox: per-sample `(C, H, W)` input, batched with `vmap`.

Stages are a tuple of `Stage`s, each with its `downsample` (a `(LayerNorm2d, Conv2d)` tuple, or
None in the first) and a tuple of `blocks`. A block runs channels-first up to its norm (timm's
LayerNorm over the channels, `LayerNorm2d` here), then its MLP channels-last as timm's (Linear
layers on the pixels as tokens `(H * W, C)`) or on the channels-first map (`conv_mlp`: 1x1
convolutions). Drop path:
the block of global index `l` draws with `fold_in(key, l)` from the sample's key (the batched
libraries draw the same from the same key, `zoo.layers.drop_path`).
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.activations import gelu
from zoo.layers.drop_path import block_keys
from zoo.layers.eqx import EqxDropPath, GlobalResponseNorm, LayerNorm, LayerNorm2d, Linear
from zoo.models.classifier.eqx import StagedClassifier
from zoo.models.common import dtype_of
from zoo.models.convnext.config import ConvNeXtConfig


class Mlp(eqx.Module):
    """fc1, GELU, (GRN,) fc2: Linear layers on `(H, W, C)`, or 1x1 convolutions on `(C, H,
    W)` (`conv`)."""

    fc1: Linear | eqx.nn.Conv2d
    grn: GlobalResponseNorm | None
    fc2: Linear | eqx.nn.Conv2d
    conv: bool = eqx.field(static=True)

    def __init__(self, dim: int, hidden: int, grn: bool, conv: bool, *, key: PRNGKeyArray,
                 dtype) -> None:
        k1, k2 = jax.random.split(key)
        if conv:
            self.fc1 = eqx.nn.Conv2d(dim, hidden, (1, 1), key=k1, dtype=dtype)
            self.fc2 = eqx.nn.Conv2d(hidden, dim, (1, 1), key=k2, dtype=dtype)
        else:
            self.fc1 = Linear(dim, hidden, key=k1, dtype=dtype)
            self.fc2 = Linear(hidden, dim, key=k2, dtype=dtype)
        self.grn = GlobalResponseNorm(hidden, channels_last=not conv, dtype=dtype) if grn else None
        self.conv = conv

    def __call__(self, x: Array) -> Array:
        """A map `(C, H, W)` (`conv`), or its pixels as tokens `(H * W, C)`, in the same
        layout out."""
        layer = (lambda f, v: f(v)) if self.conv else (lambda f, v: jax.vmap(f)(v))
        x = gelu(layer(self.fc1, x))
        if self.grn is not None:
            x = self.grn(x)  # over the pixels, whether a map or tokens
        return layer(self.fc2, x)


class Block(eqx.Module):
    """conv_dw, norm, MLP, layer scale, drop path, + the input (timm's `ConvNeXtBlock`)."""

    gamma: Array | None
    conv_dw: eqx.nn.Conv2d
    norm: LayerNorm2d
    mlp: Mlp
    drop_path: EqxDropPath

    def __init__(self, config: ConvNeXtConfig, dim: int, drop_path: float, *,
                 key: PRNGKeyArray, dtype) -> None:
        k1, k2 = jax.random.split(key)
        k = config.kernel_size
        self.gamma = (jnp.full((dim,), config.ls_init_value, dtype) if config.layer_scale
                      else None)
        self.conv_dw = eqx.nn.Conv2d(dim, dim, (k, k), padding=k // 2, groups=dim, key=k1,
                                     dtype=dtype)
        self.norm = LayerNorm2d(dim, config.norm_eps, dtype=dtype)
        self.mlp = Mlp(dim, config.mlp_hidden(dim), config.use_grn, config.conv_mlp, key=k2,
                       dtype=dtype)
        self.drop_path = EqxDropPath(drop_path)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        y = self.norm(self.conv_dw(x))  # LayerNorm over the channels: timm's either way
        if self.mlp.conv:
            y = self.mlp(y)
        else:  # channels-last, as timm's: the pixels as tokens
            c, h, w = y.shape
            y = self.mlp(y.reshape(c, h * w).T).T.reshape(c, h, w)
        if self.gamma is not None:
            y = y * self.gamma[:, None, None]
        return self.drop_path(y, key=key) + x


class Stage(eqx.Module):
    downsample: tuple[LayerNorm2d, eqx.nn.Conv2d] | None
    blocks: tuple[Block, ...]

    def __init__(self, config: ConvNeXtConfig, i: int, *, key: PRNGKeyArray, dtype) -> None:
        kd, *kb = jax.random.split(key, 1 + config.depths[i])
        dim = config.dims[i]
        self.downsample = ((LayerNorm2d(config.dims[i - 1], config.norm_eps, dtype=dtype),
                            eqx.nn.Conv2d(config.dims[i - 1], dim, (2, 2), stride=2, key=kd,
                                          dtype=dtype))
                           if i > 0 else None)
        self.blocks = tuple(Block(config, dim, rate, key=k, dtype=dtype)
                            for rate, k in zip(config.drop_path_rates()[i], kb, strict=True))


class Head(eqx.Module):
    norm: LayerNorm
    fc: Linear


class ConvNeXt(StagedClassifier):
    CLASSIFIER: ClassVar[str] = "head.fc"

    stem: tuple[eqx.nn.Conv2d, LayerNorm2d]
    stages: tuple[Stage, ...]
    head: Head
    config: ConvNeXtConfig = eqx.field(static=True)

    def __init__(self, config: ConvNeXtConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        dt = dtype_of(dtype)
        k_stem, k_fc, *k_stages = jax.random.split(key, 2 + len(config.depths))
        p = config.patch_size
        self.stem = (eqx.nn.Conv2d(config.in_channels, config.dims[0], (p, p), stride=p,
                                   key=k_stem, dtype=dt),
                     LayerNorm2d(config.dims[0], config.norm_eps, dtype=dt))
        self.stages = tuple(Stage(config, i, key=k, dtype=dt) for i, k in enumerate(k_stages))
        self.head = Head(LayerNorm(config.features, eps=config.norm_eps, dtype=dt),
                         Linear(config.features, config.num_classes, key=k_fc, dtype=dt))
        self.config = config

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Logits of one image `x` of shape `(C, H, W)`; `key`: its drop path key (training
        with `drop_path_rate > 0`)."""
        return self.forward_head(self.forward_features(x, key=key))

    def forward_stem(self, x: Array, state: None) -> tuple[Array, Array, None]:
        conv, ln = self.stem
        x = ln(conv(x))
        return x, x, state

    def forward_stage(self, i: int, x: Array, state: None, *,
                      key: PRNGKeyArray | None = None) -> tuple[Array, None]:
        """Stage `i`; block b of the model (counted over every stage) draws its drop path
        with `block_keys(key, b)`."""
        stage, first = self.stages[i], sum(self.config.depths[:i])
        if stage.downsample is not None:
            ln, conv = stage.downsample
            x = conv(ln(x))
        for index, block in enumerate(stage.blocks, first):
            x = block(x, key=None if key is None else block_keys(key, index))
        return x, state

    def pre_logits(self, x: Array) -> Array:
        """The global average pool of a feature map, `head.norm`ed (the input of `head.fc`)."""
        return self.head.norm(jnp.mean(x, axis=(1, 2)))
