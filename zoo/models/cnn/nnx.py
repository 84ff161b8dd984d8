"""CNN in Flax NNX: batched `(N, H, W, C)` input, statistics in `nnx.BatchStat` variables."""

from __future__ import annotations

import math

import jax
from flax import nnx

from zoo.models.cnn.config import CNNConfig
from zoo.models.common import dtype_of


class CNN(nnx.Module):
    def __init__(self, config: CNNConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        c1, c2 = config.features
        dt = dtype_of(param_dtype)
        self.config = config
        conv = lambda i, o: nnx.Conv(i, o, (3, 3), padding=((1, 1), (1, 1)), param_dtype=dt,
                                     rngs=rngs)
        bn = lambda c: nnx.BatchNorm(c, momentum=config.bn_momentum, epsilon=config.bn_eps,
                                     use_fast_variance=False, param_dtype=dt, rngs=rngs)
        self.conv1 = conv(config.in_channels, c1)
        self.bn1 = bn(c1) if config.batch_norm else None
        self.conv2 = conv(c1, c2)
        self.bn2 = bn(c2) if config.batch_norm else None
        self.fc1 = nnx.Linear(math.prod(config.flatten_shape), config.hidden, param_dtype=dt,
                              rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout)
        self.fc2 = nnx.Linear(config.hidden, config.num_classes, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        for conv, bn in ((self.conv1, self.bn1), (self.conv2, self.bn2)):
            x = conv(x)
            if bn is not None:
                x = bn(x)
            x = nnx.avg_pool(nnx.relu(x), (2, 2), strides=(2, 2))
        x = self.fc1(x.reshape(x.shape[0], -1))  # flattens (H, W, C): see converters
        x = nnx.relu(self.dropout(x, rngs=rngs))
        return self.fc2(x)
