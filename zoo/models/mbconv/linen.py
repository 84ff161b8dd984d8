"""timm's EfficientNet blocks and network in Flax Linen: batched `(N, H, W, C)`, statistics
in `batch_stats`; the same modules and names as `zoo.models.mbconv.torch` (Linen names the
stage lists `blocks_0_1`; the converters read `blocks.0.1`)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.layers.drop_path import block_keys
from zoo.layers.linen import LinenDropPath
from zoo.models.classifier.linen import StagedClassifier
from zoo.models.common import activation, dtype_of
from zoo.models.mbconv.config import MBConvNetConfig
from zoo.models.mbconv.spec import BlockSpec, ConvLayer


def conv(config: MBConvNetConfig, features: int, kernel: int, stride: int, dtype: Any,
         groups: int = 1, bias: bool = False) -> nn.Conv:
    p = config.conv_padding(kernel, stride)
    pads = p if isinstance(p, str) else ((p, p), (p, p))
    return nn.Conv(features, (kernel, kernel), strides=(stride, stride), padding=pads,
                   use_bias=bias, feature_group_count=groups, param_dtype=dtype)


def batch_norm(config: MBConvNetConfig, dtype: Any) -> nn.BatchNorm:
    return nn.BatchNorm(momentum=config.bn_momentum, epsilon=config.bn_eps,
                        use_fast_variance=False, param_dtype=dtype)


class SqueezeExcite(nn.Module):
    """x * gate(conv_expand(act(conv_reduce(mean(x)))))."""

    config: MBConvNetConfig
    spec: BlockSpec
    param_dtype: str = "float32"

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        self.conv_reduce = nn.Conv(self.spec.se_chs, (1, 1), param_dtype=dt)
        self.conv_expand = nn.Conv(self.spec.mid_chs, (1, 1), param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        act = activation(self.config.SE.act or self.spec.act)
        s = self.conv_expand(act(self.conv_reduce(jnp.mean(x, axis=(1, 2), keepdims=True))))
        return x * activation(self.config.SE.gate)(s)


class Block(nn.Module):
    """One of timm's blocks as its spec lays it out (`BlockSpec.layers`):
    `DepthwiseSeparable` (conv_dw bn1 act [se] conv_pw bn2 [act]), `InvertedResidual`
    (conv_pw bn1 act, conv_dw bn2 act, [se], conv_pwl bn3) or `ConvBnAct` (conv bn1 act),
    then drop path and the skip (`spec.skip`)."""

    config: MBConvNetConfig
    spec: BlockSpec
    param_dtype: str = "float32"

    def setup(self) -> None:
        before, after = self.spec.layers()
        self._add(before)
        self.se = (SqueezeExcite(self.config, self.spec, self.param_dtype) if self.spec.se_chs
                   else None)
        self._add(after)
        self.drop_path = LinenDropPath(self.spec.drop_path)

    def _add(self, layers: tuple[ConvLayer, ...]) -> None:
        """Each layer's conv and BatchNorm, by their names."""
        dt = dtype_of(self.param_dtype)
        for layer in layers:
            setattr(self, layer.conv, conv(self.config, layer.out_chs, layer.kernel,
                                           layer.stride, dt, groups=layer.groups))
            setattr(self, layer.bn, batch_norm(self.config, dt))

    def __call__(self, x: jax.Array, *, train: bool = False,
                 key: jax.Array | None = None) -> jax.Array:
        """The block's output; `key`: its drop path's (one per sample)."""
        before, after = self.spec.layers()
        y = self._layers(before, x, train)
        if self.se is not None:
            y = self.se(y)
        y = self._layers(after, y, train)
        if not self.spec.skip:
            return y
        return self.drop_path(y, deterministic=not train, key=key) + x

    def _layers(self, layers: tuple[ConvLayer, ...], y: jax.Array, train: bool) -> jax.Array:
        for layer in layers:
            y = getattr(self, layer.bn)(getattr(self, layer.conv)(y),
                                        use_running_average=not train)
            y = activation(self.spec.act)(y) if layer.act else y
        return y


def blocks(config: MBConvNetConfig, param_dtype: str) -> list[list[Block]]:
    """`blocks.i.j`: one list per stage (set in `setup`)."""
    return [[Block(config, s, param_dtype) for s in stage]
            for stage in config.stages()]


def sample_keys(module: nn.Module, config: MBConvNetConfig, x: jax.Array, train: bool,
                key: jax.Array | None) -> jax.Array | None:
    """One drop-path key per sample in training (`split(key, N)`, `key` from the "dropout"
    stream unless given: a raw key draws what the Equinox and NNX models draw from it), None
    when no block drops."""
    if not train or not any(b.drop_path for stage in config.stages() for b in stage):
        return None
    return jax.random.split(module.make_rng("dropout") if key is None else key, x.shape[0])


def run_stage(stages: list[list[Block]], i: int, x: jax.Array, train: bool,
              keys: jax.Array | None) -> jax.Array:
    """Stage `i`'s blocks in turn; block b of the model draws with `block_keys(keys, b)`."""
    b = sum(map(len, stages[:i]))
    for j, block in enumerate(stages[i]):
        x = block(x, train=train, key=None if keys is None else block_keys(keys, b + j))
    return x


class MBConvNet(StagedClassifier):
    """timm's `EfficientNet` / `MobileNetV3`, as its config says: conv_stem bn1 act,
    `blocks.i.j`, then EfficientNet's head (conv_head bn2 act on the feature map, pool,
    dropout, classifier) or, with `config.EFFICIENT_HEAD`, MobileNetV3's (pool, conv_head
    with bias, act, dropout, classifier).
    `forward_features` is the map before pooling: the head conv's, or the last stage's before
    an efficient head."""

    config: MBConvNetConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        self.conv_stem = conv(cfg, cfg.stem_chs, 3, 2, dt)
        self.bn1 = batch_norm(cfg, dt)
        self.blocks = blocks(cfg, self.param_dtype)
        self.conv_head = conv(cfg, cfg.head_chs, 1, 1, dt, bias=cfg.EFFICIENT_HEAD)
        self.bn2 = None if cfg.EFFICIENT_HEAD else batch_norm(cfg, dt)
        self.classifier = nn.Dense(cfg.num_classes, param_dtype=dt)
        self.dropout = nn.Dropout(cfg.drop_rate)

    def __call__(self, x: jax.Array, *, train: bool = False,
                 key: jax.Array | None = None) -> jax.Array:
        """Logits; in training the drop paths draw from `key` (one raw key: the masks the
        Equinox and NNX models draw from it) or the "dropout" stream, as the dropout does."""
        x = self.forward_intermediates(x, indices=1, train=train, key=key)[0]
        return self.forward_head(x, train=train)

    def stage_arguments(self, x: jax.Array, *, train: bool = False,
                        key: jax.Array | None = None) -> dict[str, Any]:
        """`train`, and the drop paths' keys of this call (`sample_keys`)."""
        return {"train": train, "keys": sample_keys(self, self.config, x, train, key)}

    def forward_stem(self, x: jax.Array, *, train: bool = False,
                     key: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        del key  # the stem draws nothing
        x = activation(self.config.act)(self.bn1(self.conv_stem(x), use_running_average=not train))
        return x, x

    def forward_stage(self, i: int, x: jax.Array, *, train: bool,
                      keys: jax.Array | None) -> jax.Array:
        return run_stage(self.blocks, i, x, train, keys)

    def forward_end(self, x: jax.Array, *, train: bool = False,
                    key: jax.Array | None = None) -> jax.Array:
        """EfficientNet's head conv on the last stage's output (an efficient head has its
        own after the pool)."""
        del key  # the head conv draws nothing
        if self.config.EFFICIENT_HEAD:
            return x
        x = self.bn2(self.conv_head(x), use_running_average=not train)
        return activation(self.config.act)(x)

    def pre_logits(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        """The classifier's input from a feature map: global average pool (then an efficient
        head's conv_head and act), dropout (in training)."""
        if self.config.EFFICIENT_HEAD:
            x = self.conv_head(jnp.mean(x, axis=(1, 2), keepdims=True))
            x = activation(self.config.act)(x).reshape(x.shape[0], -1)
        else:
            x = jnp.mean(x, axis=(1, 2))
        return self.dropout(x, deterministic=not train)
