"""ResNet in Flax Linen: batched `(N, H, W, C)` input, statistics in `batch_stats`.

Stages `layer1..layerN` are lists of blocks (Linen names them `layer1_0`; the converters read
`layer1.0`), a block's `downsample` a `(conv, bn)` list or None.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.models.classifier.linen import StagedClassifier
from zoo.models.common import dtype_of
from zoo.models.resnet.config import POOL, BlockSpec, ResNetConfig


def _conv(features: int, k: int, stride: int, padding: int | str, dtype,
          groups: int = 1) -> nn.Conv:
    pads = padding if isinstance(padding, str) else ((padding, padding), (padding, padding))
    return nn.Conv(features, (k, k), strides=(stride, stride), padding=pads, use_bias=False,
                   feature_group_count=groups, param_dtype=dtype)


def _bn(config: ResNetConfig, dtype) -> nn.BatchNorm:
    return nn.BatchNorm(momentum=config.bn_momentum, epsilon=config.bn_eps,
                        use_fast_variance=False, param_dtype=dtype)


def _shortcut(config: ResNetConfig, spec: BlockSpec, dtype) -> list[nn.Module] | None:
    return ([_conv(spec.planes * config.expansion, 1, spec.stride, config.conv_padding(0), dtype),
             _bn(config, dtype)]
            if spec.downsample else None)


def _residual(downsample: tuple[nn.Module, ...] | None, x: jax.Array, train: bool) -> jax.Array:
    if downsample is None:
        return x
    conv, bn = downsample
    return bn(conv(x), use_running_average=not train)


class Block(nn.Module):
    """torchvision's BasicBlock or Bottleneck: `conv1 bn1 relu, ...` as `config.convs` lays
    them out (the last without relu), + shortcut, relu."""

    config: ResNetConfig
    spec: BlockSpec
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        for i, (_, cout, k, stride, groups) in enumerate(cfg.convs(self.spec), 1):
            setattr(self, f"conv{i}", _conv(cout, k, stride, cfg.conv_padding(k // 2), dt, groups))
            setattr(self, f"bn{i}", _bn(cfg, dt))
        self.downsample = _shortcut(cfg, self.spec, dt)

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        y, depth = x, len(self.config.convs(self.spec))
        for i in range(1, depth + 1):
            y = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(y),
                                        use_running_average=not train)
            y = nn.relu(y) if i < depth else y
        return nn.relu(y + _residual(self.downsample, x, train))


class ResNet(StagedClassifier):
    CLASSIFIER: ClassVar[str] = "fc"

    config: ResNetConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        self.conv1 = _conv(cfg.stem_width, *cfg.stem_conv, dt)  # explicit in both paddings
        self.bn1 = _bn(cfg, dt)
        for i, blocks in enumerate(cfg.stages()):
            setattr(self, f"layer{i + 1}", [Block(cfg, spec, self.param_dtype)
                                            for spec in blocks])
        self.fc = nn.Dense(cfg.num_classes, param_dtype=dt)

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        return self.forward_head(self.forward_features(x, train=train))

    def forward_stem(self, x: jax.Array, *, train: bool = False) -> tuple[jax.Array, jax.Array]:
        """Tap 0 (after the stem's ReLU) and the first stage's input (max-pooled)."""
        x = nn.relu(self.bn1(self.conv1(x), use_running_average=not train))
        if not self.config.stem_pool:
            return x, x
        k, s, _ = POOL
        return x, nn.max_pool(x, (k, k), strides=(s, s),
                              padding=self.config.pool_padding(x.shape[1:3]))

    def forward_stage(self, i: int, x: jax.Array, *, train: bool = False) -> jax.Array:
        for block in getattr(self, f"layer{i + 1}"):
            x = block(x, train=train)
        return x

    def pre_logits(self, x: jax.Array) -> jax.Array:
        """The global average pool of a feature map (the input of `fc`)."""
        return jnp.mean(x, axis=(1, 2))
