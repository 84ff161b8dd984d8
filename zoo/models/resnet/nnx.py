"""ResNet in Flax NNX: batched `(N, H, W, C)` input, statistics in `nnx.BatchStat` variables.

Stages `layer1..layerN` are `nnx.List`s of blocks, a block's `downsample` an `nnx.List`
`[conv, bn]` or None.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.models.classifier.nnx import StagedClassifier
from zoo.models.common import dtype_of
from zoo.models.resnet.config import POOL, BlockSpec, ResNetConfig


def _conv(cin: int, cout: int, k: int, stride: int, padding: int | str, dtype,
          rngs: nnx.Rngs, groups: int = 1) -> nnx.Conv:
    pads = padding if isinstance(padding, str) else ((padding, padding), (padding, padding))
    return nnx.Conv(cin, cout, (k, k), strides=(stride, stride), padding=pads, use_bias=False,
                    feature_group_count=groups, param_dtype=dtype, rngs=rngs)


def _bn(config: ResNetConfig, channels: int, dtype, rngs: nnx.Rngs) -> nnx.BatchNorm:
    return nnx.BatchNorm(channels, momentum=config.bn_momentum, epsilon=config.bn_eps,
                         use_fast_variance=False, param_dtype=dtype, rngs=rngs)


def _shortcut(config: ResNetConfig, spec: BlockSpec, dtype, rngs: nnx.Rngs) -> nnx.List | None:
    out = spec.planes * config.expansion
    return nnx.List([_conv(spec.in_channels, out, 1, spec.stride, config.conv_padding(0), dtype,
                           rngs),
                     _bn(config, out, dtype, rngs)]) if spec.downsample else None


def _residual(downsample: nnx.List | None, x: jax.Array) -> jax.Array:
    if downsample is None:
        return x
    conv, bn = downsample
    return bn(conv(x))


class Block(nnx.Module):
    """torchvision's BasicBlock or Bottleneck: `conv1 bn1 relu, ...` as `config.convs` lays
    them out (the last without relu), + shortcut, relu."""

    def __init__(self, config: ResNetConfig, spec: BlockSpec, dtype, rngs: nnx.Rngs) -> None:
        convs = config.convs(spec)
        for i, (cin, cout, k, stride, groups) in enumerate(convs, 1):
            setattr(self, f"conv{i}", _conv(cin, cout, k, stride, config.conv_padding(k // 2),
                                            dtype, rngs, groups))
            setattr(self, f"bn{i}", _bn(config, cout, dtype, rngs))
        self.downsample = _shortcut(config, spec, dtype, rngs)
        self.depth = len(convs)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = x
        for i in range(1, self.depth + 1):
            y = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(y))
            y = nnx.relu(y) if i < self.depth else y
        return nnx.relu(y + _residual(self.downsample, x))


class ResNet(StagedClassifier):
    CLASSIFIER: ClassVar[str] = "fc"

    def __init__(self, config: ResNetConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.config = config
        self.conv1 = _conv(config.in_channels, config.stem_width, *config.stem_conv, dt, rngs)
        self.bn1 = _bn(config, config.stem_width, dt, rngs)
        for i, blocks in enumerate(config.stages()):
            setattr(self, f"layer{i + 1}", nnx.List(
                [Block(config, spec, dt, rngs) for spec in blocks]))
        self.fc = nnx.Linear(config.features, config.num_classes, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        return self.forward_head(self.forward_features(x))

    def forward_stem(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Tap 0 (after the stem's ReLU) and the first stage's input (max-pooled)."""
        x = nnx.relu(self.bn1(self.conv1(x)))
        if not self.config.stem_pool:
            return x, x
        k, s, _ = POOL
        return x, nnx.max_pool(x, (k, k), strides=(s, s),
                               padding=self.config.pool_padding(x.shape[1:3]))

    def forward_stage(self, i: int, x: jax.Array) -> jax.Array:
        for block in getattr(self, f"layer{i + 1}"):
            x = block(x)
        return x

    def pre_logits(self, x: jax.Array) -> jax.Array:
        """The global average pool of a feature map (the input of `fc`)."""
        return jnp.mean(x, axis=(1, 2))
