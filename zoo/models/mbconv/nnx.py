"""timm's EfficientNet blocks and network in Flax NNX: batched `(N, H, W, C)`, statistics in
`nnx.BatchStat` variables; the same modules and names as `zoo.models.mbconv.torch`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.drop_path import block_keys
from zoo.layers.nnx import NNXDropPath
from zoo.models.classifier.nnx import StagedClassifier
from zoo.models.common import activation, dtype_of
from zoo.models.mbconv.config import MBConvNetConfig
from zoo.models.mbconv.spec import BlockSpec, ConvLayer


def conv(config: MBConvNetConfig, cin: int, cout: int, kernel: int, stride: int, dtype: Any,
         rngs: nnx.Rngs, groups: int = 1, bias: bool = False) -> nnx.Conv:
    p = config.conv_padding(kernel, stride)
    pads = p if isinstance(p, str) else ((p, p), (p, p))
    return nnx.Conv(cin, cout, (kernel, kernel), strides=(stride, stride), padding=pads,
                    use_bias=bias, feature_group_count=groups, param_dtype=dtype, rngs=rngs)


def batch_norm(config: MBConvNetConfig, channels: int, dtype: Any,
               rngs: nnx.Rngs) -> nnx.BatchNorm:
    return nnx.BatchNorm(channels, momentum=config.bn_momentum, epsilon=config.bn_eps,
                         use_fast_variance=False, param_dtype=dtype, rngs=rngs)


class SqueezeExcite(nnx.Module):
    """x * gate(conv_expand(act(conv_reduce(mean(x)))))."""

    def __init__(self, config: MBConvNetConfig, spec: BlockSpec, dtype: Any,
                 rngs: nnx.Rngs) -> None:
        self.conv_reduce = nnx.Conv(spec.mid_chs, spec.se_chs, (1, 1), param_dtype=dtype,
                                    rngs=rngs)
        self.conv_expand = nnx.Conv(spec.se_chs, spec.mid_chs, (1, 1), param_dtype=dtype,
                                    rngs=rngs)
        self.act, self.gate = config.SE.act or spec.act, config.SE.gate

    def __call__(self, x: jax.Array) -> jax.Array:
        s = self.conv_reduce(jnp.mean(x, axis=(1, 2), keepdims=True))
        return x * activation(self.gate)(self.conv_expand(activation(self.act)(s)))


def _se(config: MBConvNetConfig, spec: BlockSpec, dtype: Any,
        rngs: nnx.Rngs) -> SqueezeExcite | None:
    return SqueezeExcite(config, spec, dtype, rngs) if spec.se_chs else None


class Block(nnx.Module):
    """One of timm's blocks as its spec lays it out (`BlockSpec.layers`):
    `DepthwiseSeparable` (conv_dw bn1 act [se] conv_pw bn2 [act]), `InvertedResidual`
    (conv_pw bn1 act, conv_dw bn2 act, [se], conv_pwl bn3) or `ConvBnAct` (conv bn1 act),
    then drop path and the skip (`spec.skip`)."""

    def __init__(self, config: MBConvNetConfig, spec: BlockSpec, dtype: Any,
                 rngs: nnx.Rngs) -> None:
        self.spec = spec
        before, after = spec.layers()
        self._add(config, before, dtype, rngs)
        self.se = _se(config, spec, dtype, rngs)
        self._add(config, after, dtype, rngs)
        self.drop_path = NNXDropPath(spec.drop_path)

    def _add(self, config: MBConvNetConfig, layers: tuple[ConvLayer, ...], dtype: Any,
             rngs: nnx.Rngs) -> None:
        """Each layer's conv and BatchNorm, by their names."""
        for layer in layers:
            setattr(self, layer.conv, conv(config, layer.in_chs, layer.out_chs, layer.kernel,
                                           layer.stride, dtype, rngs, layer.groups))
            setattr(self, layer.bn, batch_norm(config, layer.out_chs, dtype, rngs))

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        """The block's output; `key`: its drop path's (one per sample)."""
        before, after = self.spec.layers()
        y = self._layers(before, x)
        if self.se is not None:
            y = self.se(y)
        y = self._layers(after, y)
        return self.drop_path(y, rngs=key) + x if self.spec.skip else y

    def _layers(self, layers: tuple[ConvLayer, ...], y: jax.Array) -> jax.Array:
        for layer in layers:
            y = getattr(self, layer.bn)(getattr(self, layer.conv)(y))
            y = activation(self.spec.act)(y) if layer.act else y
        return y


def blocks(config: MBConvNetConfig, dtype: Any, rngs: nnx.Rngs) -> nnx.List:
    """`blocks.i.j`: one `nnx.List` per stage."""
    return nnx.List([nnx.List([Block(config, s, dtype, rngs) for s in stage])
                     for stage in config.stages()])


def sample_keys(config: MBConvNetConfig, x: jax.Array, rngs: Any,
                training: bool) -> jax.Array | None:
    """One drop-path key per sample in training (`split(key, N)` of a raw key, or of a key
    drawn from an `nnx.Rngs`' "dropout" stream), None when no block drops."""
    if (not training or rngs is None
            or not any(b.drop_path for stage in config.stages() for b in stage)):
        return None
    if isinstance(rngs, nnx.Rngs):
        rngs = rngs["dropout"]()
    elif isinstance(rngs, nnx.RngStream):
        rngs = rngs()
    return jax.random.split(rngs, x.shape[0])


def run_stage(stages: nnx.List, i: int, x: jax.Array, keys: jax.Array | None) -> jax.Array:
    """Stage `i`'s blocks in turn; block b of the model draws with `block_keys(keys, b)`."""
    b = sum(map(len, stages[:i]))
    for j, block in enumerate(stages[i]):
        x = block(x, key=None if keys is None else block_keys(keys, b + j))
    return x


class MBConvNet(StagedClassifier):
    """timm's `EfficientNet` / `MobileNetV3`, as its config says: conv_stem bn1 act,
    `blocks.i.j`, then EfficientNet's head (conv_head bn2 act on the feature map, pool,
    dropout, classifier) or, with `config.EFFICIENT_HEAD`, MobileNetV3's (pool, conv_head
    with bias, act, dropout, classifier).
    `forward_features` is the map before pooling: the head conv's, or the last stage's before
    an efficient head."""

    def __init__(self, config: MBConvNetConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt, efficient = dtype_of(param_dtype), config.EFFICIENT_HEAD
        self.config = config
        self.conv_stem = conv(config, config.in_channels, config.stem_chs, 3, 2, dt, rngs)
        self.bn1 = batch_norm(config, config.stem_chs, dt, rngs)
        self.blocks = blocks(config, dt, rngs)
        self.conv_head = conv(config, config.block_chs, config.head_chs, 1, 1, dt, rngs,
                              bias=efficient)
        self.bn2 = None if efficient else batch_norm(config, config.head_chs, dt, rngs)
        self.classifier = nnx.Linear(config.features, config.num_classes, param_dtype=dt,
                                     rngs=rngs)
        self.dropout = nnx.Dropout(config.drop_rate)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        """Logits; in training (`model.train()`) the drop paths and the dropout draw from
        `rngs` (a raw key draws the masks the Equinox model draws from it)."""
        x = self.forward_intermediates(x, indices=1, rngs=rngs)[0]
        if isinstance(rngs, jax.Array):
            rngs = block_keys(rngs, sum(map(len, self.blocks)))
        return self.forward_head(x, rngs=rngs)

    def stage_arguments(self, x: jax.Array, *, rngs: Any = None) -> dict[str, Any]:
        """The drop paths' keys of this call (`sample_keys`)."""
        return {"keys": sample_keys(self.config, x, rngs, not self.dropout.deterministic)}

    def forward_stem(self, x: jax.Array, *, rngs: Any = None) -> tuple[jax.Array, jax.Array]:
        del rngs  # the stem draws nothing
        x = activation(self.config.act)(self.bn1(self.conv_stem(x)))
        return x, x

    def forward_stage(self, i: int, x: jax.Array, *, keys: jax.Array | None) -> jax.Array:
        return run_stage(self.blocks, i, x, keys)

    def forward_end(self, x: jax.Array, *, rngs: Any = None) -> jax.Array:
        """EfficientNet's head conv on the last stage's output (an efficient head has its
        own after the pool)."""
        del rngs  # the head conv draws nothing
        if self.config.EFFICIENT_HEAD:
            return x
        return activation(self.config.act)(self.bn2(self.conv_head(x)))

    def pre_logits(self, x: jax.Array, *,
                   rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        """The classifier's input from a feature map: global average pool (then an efficient
        head's conv_head and act), dropout (in training, from `rngs`)."""
        if self.config.EFFICIENT_HEAD:
            x = self.conv_head(jnp.mean(x, axis=(1, 2), keepdims=True))
            x = activation(self.config.act)(x).reshape(x.shape[0], -1)
        else:
            x = jnp.mean(x, axis=(1, 2))
        return self.dropout(x, rngs=rngs)
