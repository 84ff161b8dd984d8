"""The official Flax ImageNet example's ResNet (flax/examples/imagenet/models.py), restated:
explicit names (`conv_init`, `bn_init`, `conv_proj`, `norm_proj`) among auto names
(`ResNetBlock_k`, `Conv_k`, `BatchNorm_k`, `Dense_0`); the blocks' convs pad as Flax's
default SAME, the stem conv explicitly (3, 3), the max-pool SAME. With its `TrainState`
(flax/examples/imagenet/train.py: BatchNorm statistics beside the params) and random
variables drawn without compiling."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.training import train_state

ModuleDef = Any


class ResNetBlock(nn.Module):
    """ResNet block."""

    filters: int
    conv: ModuleDef
    norm: ModuleDef
    act: Callable
    strides: tuple[int, int] = (1, 1)

    @nn.compact
    def __call__(self, x):
        residual = x
        y = self.conv(self.filters, (3, 3), self.strides)(x)
        y = self.norm()(y)
        y = self.act(y)
        y = self.conv(self.filters, (3, 3))(y)
        y = self.norm(scale_init=nn.initializers.zeros_init())(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters, (1, 1), self.strides, name="conv_proj")(residual)
            residual = self.norm(name="norm_proj")(residual)
        return self.act(residual + y)


class BottleneckResNetBlock(nn.Module):
    """Bottleneck ResNet block."""

    filters: int
    conv: ModuleDef
    norm: ModuleDef
    act: Callable
    strides: tuple[int, int] = (1, 1)

    @nn.compact
    def __call__(self, x):
        residual = x
        y = self.conv(self.filters, (1, 1))(x)
        y = self.norm()(y)
        y = self.act(y)
        y = self.conv(self.filters, (3, 3), self.strides)(y)
        y = self.norm()(y)
        y = self.act(y)
        y = self.conv(self.filters * 4, (1, 1))(y)
        y = self.norm(scale_init=nn.initializers.zeros_init())(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters * 4, (1, 1), self.strides, name="conv_proj")(
                residual)
            residual = self.norm(name="norm_proj")(residual)
        return self.act(residual + y)


class ResNet(nn.Module):
    """ResNetV1.5."""

    stage_sizes: Sequence[int]
    block_cls: ModuleDef
    num_classes: int
    num_filters: int = 64
    dtype: Any = jnp.float32
    act: Callable = nn.relu
    conv: ModuleDef = nn.Conv

    @nn.compact
    def __call__(self, x, train: bool = True):
        conv = partial(self.conv, use_bias=False, dtype=self.dtype)
        norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                       epsilon=1e-5, dtype=self.dtype, axis_name="batch")
        x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)],
                 name="conv_init")(x)
        x = norm(name="bn_init")(x)
        x = nn.relu(x)
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for i, block_size in enumerate(self.stage_sizes):
            for j in range(block_size):
                strides = (2, 2) if i > 0 and j == 0 else (1, 1)
                x = self.block_cls(self.num_filters * 2**i, strides=strides, conv=conv,
                                   norm=norm, act=self.act)(x)
        x = jnp.mean(x, axis=(1, 2))
        x = nn.Dense(self.num_classes, dtype=self.dtype)(x)
        return jnp.asarray(x, self.dtype)


class TrainState(train_state.TrainState):
    """The example's train state (`train.py`): BatchNorm statistics beside the params."""

    batch_stats: Any
    dynamic_scale: Any = None


def random_variables(module: nn.Module, size: int, seed: int = 0) -> dict:
    """Variables of `module` for `size` x `size` RGB images, drawn with numpy (nothing
    compiles): every parameter and BatchNorm statistic non-trivial, so that a mis-paired
    layer changes the outputs."""
    abstract = jax.eval_shape(lambda k: module.init(k, jnp.zeros((1, size, size, 3)),
                                                    train=False), jax.random.key(0))
    rng = np.random.default_rng(seed)

    def draw(path, a):
        name = str(path[-1].key)
        if name == "var":
            return (0.5 + rng.random(a.shape)).astype(a.dtype)
        scale = 0.3 if name in ("mean", "bias", "scale") else 1 / np.sqrt(np.prod(a.shape[:-1]))
        return (scale * rng.standard_normal(a.shape) + (name == "scale")).astype(a.dtype)

    return jax.tree_util.tree_map_with_path(draw, abstract)
