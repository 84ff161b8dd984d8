"""CNN in Flax NNX: batched `(N, H, W, C)` input, statistics in `nnx.BatchStat` variables."""

from __future__ import annotations

import math
from itertools import pairwise

import jax
from flax import nnx

from zoo.models.cnn.config import CNNConfig
from zoo.models.common import dtype_of


class CNN(nnx.Module):
    def __init__(self, config: CNNConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        c, dt = (config.in_channels, *config.features), dtype_of(param_dtype)
        self.config = config
        self.convs = nnx.List([nnx.Conv(i, o, (3, 3), padding=((1, 1), (1, 1)), param_dtype=dt,
                                        rngs=rngs) for i, o in pairwise(c)])
        self.bns = nnx.List([nnx.BatchNorm(o, momentum=config.bn_momentum,
                                           epsilon=config.bn_eps, use_fast_variance=False,
                                           param_dtype=dt, rngs=rngs)
                             for o in config.features] if config.batch_norm else [])
        self.fc1 = nnx.Linear(math.prod(config.flatten_shape), config.hidden, param_dtype=dt,
                              rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout)
        self.fc2 = nnx.Linear(config.hidden, config.num_classes, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        self.config.check_input(x.shape, channels_last=True)
        for i, conv in enumerate(self.convs):
            x = conv(x)
            if self.bns:
                x = self.bns[i](x)
            x = nnx.avg_pool(nnx.relu(x), (2, 2), strides=(2, 2))
        x = self.fc1(x.reshape(x.shape[0], -1))  # flattens (H, W, C): see converters
        x = nnx.relu(self.dropout(x, rngs=rngs))
        return self.fc2(x)
