"""ResNet in Equinox: per-sample `(C, H, W)` input, BatchNorm statistics in `eqx.nn.State`.

Stages are the declared fields `layer1..layer4`, each a tuple of blocks (empty when the config
has fewer stages); a block's `downsample` is a `(conv, bn)` tuple or None.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.eqx import BatchNorm, Linear
from zoo.models.classifier.eqx import StagedClassifier
from zoo.models.common import dtype_of
from zoo.models.resnet.config import POOL, BlockSpec, ResNetConfig

State = eqx.nn.State


def _conv(cin: int, cout: int, k: int, stride: int, padding: int | str, key: PRNGKeyArray,
          dtype, groups: int = 1) -> eqx.nn.Conv2d:
    return eqx.nn.Conv2d(cin, cout, (k, k), stride=stride, padding=padding, use_bias=False,
                         groups=groups, key=key, dtype=dtype)


def _bn(config: ResNetConfig, channels: int, dtype) -> BatchNorm:
    return BatchNorm(channels, "batch", config.bn_momentum, config.bn_eps, dtype=dtype)


def _shortcut(config: ResNetConfig, spec: BlockSpec, key: PRNGKeyArray,
              dtype) -> tuple[eqx.nn.Conv2d, BatchNorm] | None:
    out = spec.planes * config.expansion
    return ((_conv(spec.in_channels, out, 1, spec.stride, config.conv_padding(0), key, dtype),
             _bn(config, out, dtype))
            if spec.downsample else None)


def _residual(downsample: tuple[eqx.nn.Conv2d, BatchNorm] | None, x: Array,
              state: State) -> tuple[Array, State]:
    if downsample is None:
        return x, state
    conv, bn = downsample
    return bn(conv(x), state)


class BasicBlock(eqx.Module):
    """conv3x3 (strided) bn relu, conv3x3 bn, + shortcut, relu."""

    conv1: eqx.nn.Conv2d
    bn1: BatchNorm
    conv2: eqx.nn.Conv2d
    bn2: BatchNorm
    downsample: tuple[eqx.nn.Conv2d, BatchNorm] | None

    def __init__(self, config: ResNetConfig, spec: BlockSpec, *, key: PRNGKeyArray,
                 dtype) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        p = spec.planes
        self.conv1 = _conv(spec.in_channels, p, 3, spec.stride, config.conv_padding(1), k1, dtype)
        self.bn1 = _bn(config, p, dtype)
        self.conv2 = _conv(p, p, 3, 1, config.conv_padding(1), k2, dtype)
        self.bn2 = _bn(config, p, dtype)
        self.downsample = _shortcut(config, spec, k3, dtype)

    def __call__(self, x: Array, state: State) -> tuple[Array, State]:
        y, state = self.bn1(self.conv1(x), state)
        y, state = self.bn2(self.conv2(jax.nn.relu(y)), state)
        identity, state = _residual(self.downsample, x, state)
        return jax.nn.relu(y + identity), state


class Bottleneck(eqx.Module):
    """conv1x1 bn relu, conv3x3 (strided, grouped) bn relu, conv1x1 (x4) bn, + shortcut,
    relu."""

    conv1: eqx.nn.Conv2d
    bn1: BatchNorm
    conv2: eqx.nn.Conv2d
    bn2: BatchNorm
    conv3: eqx.nn.Conv2d
    bn3: BatchNorm
    downsample: tuple[eqx.nn.Conv2d, BatchNorm] | None

    def __init__(self, config: ResNetConfig, spec: BlockSpec, *, key: PRNGKeyArray,
                 dtype) -> None:
        k1, k2, k3, k4 = jax.random.split(key, 4)
        w, out = spec.width, spec.planes * config.expansion
        self.conv1 = _conv(spec.in_channels, w, 1, 1, config.conv_padding(0), k1, dtype)
        self.bn1 = _bn(config, w, dtype)
        self.conv2 = _conv(w, w, 3, spec.stride, config.conv_padding(1), k2, dtype,
                           config.groups)
        self.bn2 = _bn(config, w, dtype)
        self.conv3 = _conv(w, out, 1, 1, config.conv_padding(0), k3, dtype)
        self.bn3 = _bn(config, out, dtype)
        self.downsample = _shortcut(config, spec, k4, dtype)

    def __call__(self, x: Array, state: State) -> tuple[Array, State]:
        y, state = self.bn1(self.conv1(x), state)
        y, state = self.bn2(self.conv2(jax.nn.relu(y)), state)
        y, state = self.bn3(self.conv3(jax.nn.relu(y)), state)
        identity, state = _residual(self.downsample, x, state)
        return jax.nn.relu(y + identity), state


BLOCKS: dict[str, type[BasicBlock | Bottleneck]] = {"basic": BasicBlock,
                                                    "bottleneck": Bottleneck}
Stage = tuple[BasicBlock | Bottleneck, ...]


class ResNet(StagedClassifier):
    has_state: ClassVar[bool] = True  # zoo.create returns (model, state)
    CLASSIFIER: ClassVar[str] = "fc"

    conv1: eqx.nn.Conv2d
    bn1: BatchNorm
    layer1: Stage
    layer2: Stage
    layer3: Stage
    layer4: Stage
    fc: Linear
    config: ResNetConfig = eqx.field(static=True)

    def __init__(self, config: ResNetConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        dt = dtype_of(dtype)
        stages = config.stages()
        k_stem, k_fc, *k_stages = jax.random.split(key, 2 + len(stages))
        k, s, p = config.stem_conv
        self.conv1 = _conv(config.in_channels, config.stem_width, k, s, p, k_stem, dt)
        self.bn1 = _bn(config, config.stem_width, dt)
        for i in range(4):
            blocks = stages[i] if i < len(stages) else ()
            keys = jax.random.split(k_stages[i], len(blocks)) if blocks else ()
            setattr(self, f"layer{i + 1}", tuple(
                BLOCKS[config.block](config, spec, key=kb, dtype=dt)
                for spec, kb in zip(blocks, keys, strict=True)))
        self.fc = Linear(config.features, config.num_classes, key=k_fc, dtype=dt)
        self.config = config

    def __call__(self, x: Array, state: State, *,
                 key: PRNGKeyArray | None = None) -> tuple[Array, State]:
        features, state = self.forward_features(x, state)
        return self.forward_head(features), state

    def forward_stem(self, x: Array, state: State) -> tuple[Array, Array, State]:
        """Tap 0 (after the stem's ReLU), the first stage's input (max-pooled, padded for
        this size: Flax's SAME depends on it) and the state."""
        x, state = self.bn1(self.conv1(x), state)
        x = jax.nn.relu(x)
        if not self.config.stem_pool:
            return x, x, state
        pool = eqx.nn.MaxPool2d(POOL[0], POOL[1], padding=self.config.pool_padding(x.shape[1:]))
        return x, pool(x), state

    def forward_stage(self, i: int, x: Array, state: State, *,
                      key: PRNGKeyArray | None = None) -> tuple[Array, State]:
        """Stage `i`'s blocks (`key` is unused: a ResNet draws nothing)."""
        for block in (self.layer1, self.layer2, self.layer3, self.layer4)[i]:
            x, state = block(x, state)
        return x, state


    def pre_logits(self, x: Array) -> Array:
        """The global average pool of a feature map (the input of `fc`)."""
        return jnp.mean(x, axis=(1, 2))
