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


class Block(eqx.Module):
    """torchvision's BasicBlock or Bottleneck: `conv1 bn1 relu, ...` as `config.convs` lays
    them out (the last without relu; a BasicBlock has no `conv3`, `bn3`), + shortcut, relu."""

    conv1: eqx.nn.Conv2d
    bn1: BatchNorm
    conv2: eqx.nn.Conv2d
    bn2: BatchNorm
    conv3: eqx.nn.Conv2d | None
    bn3: BatchNorm | None
    downsample: tuple[eqx.nn.Conv2d, BatchNorm] | None

    def __init__(self, config: ResNetConfig, spec: BlockSpec, *, key: PRNGKeyArray,
                 dtype) -> None:
        *keys, k_shortcut = jax.random.split(key, len(config.convs(spec)) + 1)
        self.conv3 = self.bn3 = None
        for i, ((cin, cout, k, stride, groups), kc) in enumerate(
                zip(config.convs(spec), keys, strict=True), 1):
            setattr(self, f"conv{i}", _conv(cin, cout, k, stride, config.conv_padding(k // 2), kc,
                                            dtype, groups))
            setattr(self, f"bn{i}", _bn(config, cout, dtype))
        self.downsample = _shortcut(config, spec, k_shortcut, dtype)

    def __call__(self, x: Array, state: State) -> tuple[Array, State]:
        layers = [(c, b) for c, b in ((self.conv1, self.bn1), (self.conv2, self.bn2),
                                      (self.conv3, self.bn3)) if c is not None]
        y = x
        for i, (conv, bn) in enumerate(layers, 1):
            y, state = bn(conv(y), state)
            y = jax.nn.relu(y) if i < len(layers) else y
        identity, state = _residual(self.downsample, x, state)
        return jax.nn.relu(y + identity), state


Stage = tuple[Block, ...]


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
                Block(config, spec, key=kb, dtype=dt)
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
