"""ConvNeXt in Flax NNX: batched `(N, H, W, C)` input.

`stem`, `stages`, a stage's `downsample` and `blocks` are `nnx.List`s. Channels-last
throughout: timm's LayerNorm2d is a LayerNorm over the last axis, the MLP's 1x1 convolutions
(`conv_mlp`) are `nnx.Conv` with a 1x1 kernel. Drop path is on after `model.train()` and
draws from the `rngs` given at call time (a key, an `nnx.Rngs` or an `RngStream`): one key per
call, split per sample and folded with each block's index, as the Equinox model draws from each
sample's key (`zoo.layers.drop_path`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.activations import gelu
from zoo.layers.drop_path import block_keys
from zoo.layers.nnx import GlobalResponseNorm, LayerNorm, NNXDropPath
from zoo.models.classifier.nnx import StagedClassifier
from zoo.models.common import dtype_of
from zoo.models.convnext.config import ConvNeXtConfig


def _conv(cin: int, cout: int, k: int, stride: int, padding: int, dtype, rngs: nnx.Rngs,
          groups: int = 1) -> nnx.Conv:
    return nnx.Conv(cin, cout, (k, k), strides=(stride, stride),
                    padding=((padding, padding), (padding, padding)),
                    feature_group_count=groups, param_dtype=dtype, rngs=rngs)


def _norm(config: ConvNeXtConfig, dim: int, dtype, rngs: nnx.Rngs) -> LayerNorm:
    return LayerNorm(dim, epsilon=config.norm_eps, param_dtype=dtype, rngs=rngs)


def _key(rngs: Any) -> jax.Array | None:
    """The key of one call from `rngs` (a key, an `nnx.Rngs`' "dropout" stream, a stream)."""
    if isinstance(rngs, nnx.Rngs):
        return rngs.dropout()
    if isinstance(rngs, nnx.RngStream):
        return rngs()
    return rngs


class Mlp(nnx.Module):
    """fc1, GELU, (GRN,) fc2: Linear layers, or 1x1 convolutions (`conv_mlp`: timm's shapes)."""

    def __init__(self, config: ConvNeXtConfig, dim: int, dtype, rngs: nnx.Rngs) -> None:
        hidden = config.mlp_hidden(dim)
        dense = ((lambda i, o: _conv(i, o, 1, 1, 0, dtype, rngs)) if config.conv_mlp
                 else (lambda i, o: nnx.Linear(i, o, param_dtype=dtype, rngs=rngs)))
        self.fc1 = dense(dim, hidden)
        self.grn = GlobalResponseNorm(hidden, param_dtype=dtype) if config.use_grn else None
        self.fc2 = dense(hidden, dim)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = gelu(self.fc1(x))
        if self.grn is not None:
            x = self.grn(x)
        return self.fc2(x)


class Block(nnx.Module):
    """conv_dw, norm, MLP, layer scale, drop path, + the input (timm's `ConvNeXtBlock`)."""

    def __init__(self, config: ConvNeXtConfig, dim: int, drop_path: float, dtype,
                 rngs: nnx.Rngs) -> None:
        k = config.kernel_size
        self.gamma = (nnx.Param(jnp.full((dim,), config.ls_init_value, dtype))
                      if config.layer_scale else None)
        self.conv_dw = _conv(dim, dim, k, 1, k // 2, dtype, rngs, dim)
        self.norm = _norm(config, dim, dtype, rngs)
        self.mlp = Mlp(config, dim, dtype, rngs)
        self.drop_path = NNXDropPath(drop_path)

    def __call__(self, x: jax.Array, *, rngs: jax.Array | None = None) -> jax.Array:
        y = self.mlp(self.norm(self.conv_dw(x)))
        if self.gamma is not None:
            y = y * self.gamma[...].reshape(1, 1, 1, -1)
        return self.drop_path(y, rngs=rngs) + x


class Stage(nnx.Module):
    def __init__(self, config: ConvNeXtConfig, i: int, dtype, rngs: nnx.Rngs) -> None:
        dim = config.dims[i]
        self.downsample = (nnx.List([_norm(config, config.dims[i - 1], dtype, rngs),
                                     _conv(config.dims[i - 1], dim, 2, 2, 0, dtype, rngs)])
                           if i > 0 else None)
        self.blocks = nnx.List([Block(config, dim, rate, dtype, rngs)
                                for rate in config.drop_path_rates()[i]])


class Head(nnx.Module):
    def __init__(self, config: ConvNeXtConfig, dtype, rngs: nnx.Rngs) -> None:
        self.norm = _norm(config, config.features, dtype, rngs)
        self.fc = nnx.Linear(config.features, config.num_classes, param_dtype=dtype, rngs=rngs)


class ConvNeXt(StagedClassifier):
    CLASSIFIER: ClassVar[str] = "head.fc"

    def __init__(self, config: ConvNeXtConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.config = config
        p = config.patch_size
        self.stem = nnx.List([_conv(config.in_channels, config.dims[0], p, p, 0, dt, rngs),
                              _norm(config, config.dims[0], dt, rngs)])
        self.stages = nnx.List([Stage(config, i, dt, rngs) for i in range(len(config.depths))])
        self.head = Head(config, dt, rngs)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        """Logits; `rngs`: drop path's randomness (training with `drop_path_rate > 0`)."""
        return self.forward_head(self.forward_features(x, rngs=rngs))

    def stage_arguments(self, x: jax.Array, *, rngs: Any = None) -> dict[str, Any]:
        """The drop path keys of this call, one per sample (None without `rngs`)."""
        key = _key(rngs)
        return {"samples": None if key is None else jax.random.split(key, x.shape[0])}

    def forward_stem(self, x: jax.Array, *, rngs: Any = None) -> tuple[jax.Array, jax.Array]:
        del rngs  # the stem draws nothing
        conv, ln = self.stem
        x = ln(conv(x))
        return x, x

    def forward_stage(self, i: int, x: jax.Array, *, samples: jax.Array | None) -> jax.Array:
        """Stage `i`; block b of the model (counted over every stage) draws its drop path
        with `block_keys(samples, b)`."""
        stage, first = self.stages[i], sum(self.config.depths[:i])
        if stage.downsample is not None:
            ln, conv = stage.downsample
            x = conv(ln(x))
        for index, block in enumerate(stage.blocks, first):
            x = block(x, rngs=None if samples is None else block_keys(samples, index))
        return x

    def pre_logits(self, x: jax.Array) -> jax.Array:
        """The global average pool of a feature map, `head.norm`ed (the input of `head.fc`)."""
        return self.head.norm(jnp.mean(x, axis=(1, 2)))
