"""timm's EfficientNet blocks and network in Equinox: per-sample `(C, H, W)`, BatchNorm
statistics in `eqx.nn.State`; the same modules and names as `zoo.models.mbconv.torch`."""

from __future__ import annotations

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.drop_path import block_keys
from zoo.layers.eqx import BatchNorm, EqxDropPath, Linear
from zoo.models.classifier.eqx import StagedClassifier
from zoo.models.common import activation, dtype_of
from zoo.models.mbconv.config import MBConvNetConfig
from zoo.models.mbconv.spec import BlockSpec, ConvLayer

State = eqx.nn.State


def conv(config: MBConvNetConfig, cin: int, cout: int, kernel: int, stride: int,
         key: PRNGKeyArray, dtype: Any, groups: int = 1, bias: bool = False) -> eqx.nn.Conv2d:
    return eqx.nn.Conv2d(cin, cout, (kernel, kernel), stride=stride,
                         padding=config.conv_padding(kernel, stride), use_bias=bias,
                         groups=groups, key=key, dtype=dtype)


def batch_norm(config: MBConvNetConfig, channels: int, dtype: Any) -> BatchNorm:
    return BatchNorm(channels, "batch", config.bn_momentum, config.bn_eps, dtype=dtype)


class SqueezeExcite(eqx.Module):
    """x * gate(conv_expand(act(conv_reduce(mean(x)))))."""

    conv_reduce: eqx.nn.Conv2d
    conv_expand: eqx.nn.Conv2d
    act: str = eqx.field(static=True)
    gate: str = eqx.field(static=True)

    def __init__(self, config: MBConvNetConfig, spec: BlockSpec, *, key: PRNGKeyArray,
                 dtype: Any) -> None:
        k1, k2 = jax.random.split(key)
        self.conv_reduce = eqx.nn.Conv2d(spec.mid_chs, spec.se_chs, (1, 1), key=k1, dtype=dtype)
        self.conv_expand = eqx.nn.Conv2d(spec.se_chs, spec.mid_chs, (1, 1), key=k2, dtype=dtype)
        self.act, self.gate = config.SE.act or spec.act, config.SE.gate

    def __call__(self, x: Array) -> Array:
        s = self.conv_reduce(jnp.mean(x, axis=(1, 2), keepdims=True))
        return x * activation(self.gate)(self.conv_expand(activation(self.act)(s)))


def _se(config: MBConvNetConfig, spec: BlockSpec, key: PRNGKeyArray,
        dtype: Any) -> SqueezeExcite | None:
    return SqueezeExcite(config, spec, key=key, dtype=dtype) if spec.se_chs else None


class Block(eqx.Module):
    """One of timm's blocks as its spec lays it out (`BlockSpec.layers`): conv + BatchNorm
    layers, the squeeze-and-excitation `se` between those before and those after it, drop
    path and the skip (`spec.skip`). The subclasses declare the fields, in timm's order."""

    def __init__(self, config: MBConvNetConfig, spec: BlockSpec, *, key: PRNGKeyArray,
                 dtype: Any) -> None:
        before, after = spec.layers()
        count = len(before) + len(after)
        # a key per layer and the se's in their order; one layer (ConvBnAct) takes `key` itself
        keys = iter(jax.random.split(key, count + 1) if count > 1 else (key, key))
        for layer in before:
            self._add(config, layer, next(keys), dtype)
        self.se = _se(config, spec, next(keys), dtype)
        for layer in after:
            self._add(config, layer, next(keys), dtype)
        self.drop_path = EqxDropPath(spec.drop_path)
        self.spec = spec

    def _add(self, config: MBConvNetConfig, layer: ConvLayer, key: PRNGKeyArray,
             dtype: Any) -> None:
        """The layer's conv and BatchNorm, by their names."""
        setattr(self, layer.conv, conv(config, layer.in_chs, layer.out_chs, layer.kernel,
                                       layer.stride, key, dtype, groups=layer.groups))
        setattr(self, layer.bn, batch_norm(config, layer.out_chs, dtype))

    def __call__(self, x: Array, state: State, *,
                 key: PRNGKeyArray | None = None) -> tuple[Array, State]:
        """The block's output and the state; `key`: its drop path's."""
        before, after = self.spec.layers()
        y, state = self._layers(before, x, state)
        if self.se is not None:
            y = self.se(y)
        y, state = self._layers(after, y, state)
        return (self.drop_path(y, key=key) + x if self.spec.skip else y), state

    def _layers(self, layers: tuple[ConvLayer, ...], y: Array,
                state: State) -> tuple[Array, State]:
        for layer in layers:
            y, state = getattr(self, layer.bn)(getattr(self, layer.conv)(y), state)
            y = activation(self.spec.act)(y) if layer.act else y
        return y, state


class DepthwiseSeparable(Block):
    """conv_dw bn1 act [se] conv_pw bn2 [act] [+ x]."""

    conv_dw: eqx.nn.Conv2d
    bn1: BatchNorm
    se: SqueezeExcite | None
    conv_pw: eqx.nn.Conv2d
    bn2: BatchNorm
    drop_path: EqxDropPath
    spec: BlockSpec = eqx.field(static=True)


class InvertedResidual(Block):
    """conv_pw bn1 act, conv_dw bn2 act, [se], conv_pwl bn3 [+ x]."""

    conv_pw: eqx.nn.Conv2d
    bn1: BatchNorm
    conv_dw: eqx.nn.Conv2d
    bn2: BatchNorm
    se: SqueezeExcite | None
    conv_pwl: eqx.nn.Conv2d
    bn3: BatchNorm
    drop_path: EqxDropPath
    spec: BlockSpec = eqx.field(static=True)


class ConvBnAct(Block):
    """conv bn1 act [+ x] (no se: always None)."""

    conv: eqx.nn.Conv2d
    bn1: BatchNorm
    se: None
    drop_path: EqxDropPath
    spec: BlockSpec = eqx.field(static=True)


BLOCKS: dict[str, type[Block]] = {"ds": DepthwiseSeparable, "ir": InvertedResidual,
                                  "cn": ConvBnAct}


def blocks(config: MBConvNetConfig, key: PRNGKeyArray, dtype: Any
           ) -> tuple[tuple[Block, ...], ...]:
    """`blocks.i.j`: one tuple per stage."""
    stages = config.stages()
    keys = iter(jax.random.split(key, sum(map(len, stages))))
    return tuple(tuple(BLOCKS[s.type](config, s, key=next(keys), dtype=dtype) for s in stage)
                 for stage in stages)


def run_stage(stages: tuple[tuple[Block, ...], ...], i: int, x: Array, state: State,
              key: PRNGKeyArray | None) -> tuple[Array, State]:
    """Stage `i`'s blocks in turn; block b of the model (counted over every stage) draws its
    drop path with `block_keys(key, b)` (`zoo.layers.drop_path`)."""
    b = sum(map(len, stages[:i]))
    for j, block in enumerate(stages[i]):
        x, state = block(x, state, key=None if key is None else block_keys(key, b + j))
    return x, state


class MBConvNet(StagedClassifier):
    """timm's `EfficientNet` / `MobileNetV3` of one image, as its config says: conv_stem bn1
    act, `blocks.i.j`, then EfficientNet's head (conv_head bn2 act on the feature map, pool,
    dropout, classifier) or, with `config.EFFICIENT_HEAD`, MobileNetV3's (pool, conv_head
    with bias, act, dropout, classifier).
    `forward_features` is the map before pooling: the head conv's, or the last stage's before
    an efficient head."""

    has_state: ClassVar[bool] = True  # zoo.create returns (model, state)

    conv_stem: eqx.nn.Conv2d
    bn1: BatchNorm
    blocks: tuple[tuple[Block, ...], ...]
    conv_head: eqx.nn.Conv2d
    bn2: BatchNorm | None
    classifier: Linear
    dropout: eqx.nn.Dropout
    config: MBConvNetConfig = eqx.field(static=True)

    def __init__(self, config: MBConvNetConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        dt = dtype_of(dtype)
        k_stem, k_blocks, k_head, k_fc = jax.random.split(key, 4)
        efficient = config.EFFICIENT_HEAD
        self.conv_stem = conv(config, config.in_channels, config.stem_chs, 3, 2, k_stem, dt)
        self.bn1 = batch_norm(config, config.stem_chs, dt)
        self.blocks = blocks(config, k_blocks, dt)
        self.conv_head = conv(config, config.block_chs, config.head_chs, 1, 1, k_head, dt,
                              bias=efficient)
        self.bn2 = None if efficient else batch_norm(config, config.head_chs, dt)
        self.classifier = Linear(config.features, config.num_classes, key=k_fc, dtype=dt)
        self.dropout = eqx.nn.Dropout(config.drop_rate)
        self.config = config

    def __call__(self, x: Array, state: State, *,
                 key: PRNGKeyArray | None = None) -> tuple[Array, State]:
        """Logits of one image; `key` (training) draws the drop paths and the dropout."""
        (x, _), state = self.forward_intermediates(x, state, indices=1, key=key)
        head_key = None if key is None else block_keys(key, sum(map(len, self.blocks)))
        return self.forward_head(x, key=head_key), state

    def forward_stem(self, x: Array, state: State) -> tuple[Array, Array, State]:
        x, state = self.bn1(self.conv_stem(x), state)
        x = activation(self.config.act)(x)
        return x, x, state

    def forward_stage(self, i: int, x: Array, state: State, *,
                      key: PRNGKeyArray | None = None) -> tuple[Array, State]:
        return run_stage(self.blocks, i, x, state, key)

    def forward_end(self, x: Array, state: State) -> tuple[Array, State]:
        """EfficientNet's head conv on the last stage's output (an efficient head has its
        own after the pool)."""
        if self.config.EFFICIENT_HEAD:
            return x, state
        x, state = self.bn2(self.conv_head(x), state)
        return activation(self.config.act)(x), state

    def pre_logits(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The classifier's input from a feature map: global average pool (then an efficient
        head's conv_head and act), dropout (`key`: its mask, in training)."""
        if self.config.EFFICIENT_HEAD:
            x = self.conv_head(jnp.mean(x, axis=(1, 2), keepdims=True))
            x = activation(self.config.act)(x).reshape(-1)
        else:
            x = jnp.mean(x, axis=(1, 2))
        return self.dropout(x, key=key)
