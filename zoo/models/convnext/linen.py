"""ConvNeXt in Flax Linen: batched `(N, H, W, C)` input.

`stem` and a stage's `downsample` are lists of layers, `stages` and a stage's `blocks` lists of
modules (Linen names them `stages_0`, `blocks_1`; the converters read `stages.0.blocks.1`).
Channels-last throughout: timm's LayerNorm2d is a LayerNorm over the last axis, the MLP's 1x1
convolutions (`conv_mlp`) are `nn.Conv` with a 1x1 kernel. Drop path draws from the "dropout"
stream: one key per call, split per sample and folded with each block's index, as the Equinox
model draws from each sample's key (`zoo.layers.drop_path`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.layers.activations import gelu
from zoo.layers.drop_path import block_keys
from zoo.layers.linen import GlobalResponseNorm, LayerNorm, LinenDropPath
from zoo.models.classifier.linen import StagedClassifier
from zoo.models.common import dtype_of
from zoo.models.convnext.config import ConvNeXtConfig


def _conv(features: int, k: int, stride: int, padding: int, dtype, groups: int = 1) -> nn.Conv:
    return nn.Conv(features, (k, k), strides=(stride, stride),
                   padding=((padding, padding), (padding, padding)),
                   feature_group_count=groups, param_dtype=dtype)


def _norm(config: ConvNeXtConfig, dtype) -> LayerNorm:
    return LayerNorm(epsilon=config.norm_eps, param_dtype=dtype)


class Mlp(nn.Module):
    """fc1, GELU, (GRN,) fc2: Dense layers, or 1x1 convolutions (`conv_mlp`: timm's shapes)."""

    config: ConvNeXtConfig
    dim: int
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt, hidden = self.config, dtype_of(self.param_dtype), self.config.mlp_hidden(self.dim)
        dense = ((lambda n: _conv(n, 1, 1, 0, dt)) if cfg.conv_mlp
                 else (lambda n: nn.Dense(n, param_dtype=dt)))
        self.fc1 = dense(hidden)
        self.grn = GlobalResponseNorm(param_dtype=dt) if cfg.use_grn else None
        self.fc2 = dense(self.dim)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = gelu(self.fc1(x))
        if self.grn is not None:
            x = self.grn(x)
        return self.fc2(x)


class Block(nn.Module):
    """conv_dw, norm, MLP, layer scale, drop path, + the input (timm's `ConvNeXtBlock`)."""

    config: ConvNeXtConfig
    dim: int
    drop_path_rate: float
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        if cfg.layer_scale:
            self.gamma = self.param("gamma", nn.initializers.constant(cfg.ls_init_value),
                                    (self.dim,), dt)
        self.conv_dw = _conv(self.dim, cfg.kernel_size, 1, cfg.kernel_size // 2, dt, self.dim)
        self.norm = _norm(cfg, dt)
        self.mlp = Mlp(cfg, self.dim, self.param_dtype)
        self.drop_path = LinenDropPath(self.drop_path_rate)

    def __call__(self, x: jax.Array, *, train: bool = False,
                 key: jax.Array | None = None) -> jax.Array:
        y = self.mlp(self.norm(self.conv_dw(x)))
        if self.config.layer_scale:
            y = y * self.gamma.reshape(1, 1, 1, -1)
        return self.drop_path(y, deterministic=not train, key=key) + x


class Stage(nn.Module):
    config: ConvNeXtConfig
    index: int
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, i, dt = self.config, self.index, dtype_of(self.param_dtype)
        self.downsample = [_norm(cfg, dt), _conv(cfg.dims[i], 2, 2, 0, dt)] if i > 0 else None
        self.blocks = [Block(cfg, cfg.dims[i], rate, self.param_dtype)
                       for rate in cfg.drop_path_rates()[i]]

    def __call__(self, x: jax.Array, *, train: bool = False,
                 keys: Sequence[jax.Array | None] = ()) -> jax.Array:
        if self.downsample is not None:
            norm, conv = self.downsample
            x = conv(norm(x))
        for block, key in zip(self.blocks, keys or [None] * len(self.blocks), strict=True):
            x = block(x, train=train, key=key)
        return x


class Head(nn.Module):
    config: ConvNeXtConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        self.norm = _norm(self.config, dt)
        self.fc = nn.Dense(self.config.num_classes, param_dtype=dt)

    def __call__(self, x: jax.Array, pre_logits: bool = False) -> jax.Array:
        pooled = self.norm(jnp.mean(x, axis=(1, 2)))
        return pooled if pre_logits else self.fc(pooled)


class ConvNeXt(StagedClassifier):
    CLASSIFIER: ClassVar[str] = "head.fc"

    config: ConvNeXtConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        self.stem = [_conv(cfg.dims[0], cfg.patch_size, cfg.patch_size, 0, dt), _norm(cfg, dt)]
        self.stages = [Stage(cfg, i, self.param_dtype) for i in range(len(cfg.depths))]
        self.head = Head(cfg, self.param_dtype)

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        return self.forward_head(self.forward_features(x, train=train))

    def _block_keys(self, batch: int, train: bool) -> list[list[jax.Array | None]]:
        """Each stage's blocks' keys (one per sample): from the "dropout" stream in training
        with drop path, else None."""
        cfg = self.config
        if not (train and cfg.drop_path_rate > 0):
            return [[] for _ in cfg.depths]
        samples = jax.random.split(self.make_rng("dropout"), batch)
        index = iter(range(sum(cfg.depths)))
        return [[block_keys(samples, next(index)) for _ in range(n)] for n in cfg.depths]

    def stage_arguments(self, x: jax.Array, *, train: bool = False) -> dict[str, Any]:
        """`train`, and each stage's blocks' drop path keys for this call."""
        return {"train": train, "keys": self._block_keys(x.shape[0], train)}

    def forward_stem(self, x: jax.Array, *, train: bool = False) -> tuple[jax.Array, jax.Array]:
        del train  # the stem has no BatchNorm
        conv, ln = self.stem
        x = ln(conv(x))
        return x, x

    def forward_stage(self, i: int, x: jax.Array, *, train: bool,
                      keys: list[list[jax.Array | None]]) -> jax.Array:
        return self.stages[i](x, train=train, keys=keys[i])

    def pre_logits(self, x: jax.Array) -> jax.Array:
        """The global average pool of a feature map, `head.norm`ed (the input of `head.fc`)."""
        return self.head(x, pre_logits=True)
