"""CNN in Equinox: per-sample `(C, H, W)` input, BatchNorm statistics in `eqx.nn.State`."""

from __future__ import annotations

import math
from typing import ClassVar

import equinox as eqx
import jax
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.eqx import BatchNorm
from zoo.models.cnn.config import CNNConfig
from zoo.models.common import dtype_of


class CNN(eqx.Module):
    has_state: ClassVar[bool] = True  # zoo.create returns (model, state)

    conv1: eqx.nn.Conv2d
    bn1: BatchNorm | None
    conv2: eqx.nn.Conv2d
    bn2: BatchNorm | None
    fc1: eqx.nn.Linear
    dropout: eqx.nn.Dropout
    fc2: eqx.nn.Linear
    pool: eqx.nn.AvgPool2d
    config: CNNConfig = eqx.field(static=True)

    def __init__(self, config: CNNConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        k1, k2, k3, k4 = jax.random.split(key, 4)
        c1, c2 = config.features
        dt = dtype_of(dtype)
        bn = lambda c: BatchNorm(c, "batch", config.bn_momentum, config.bn_eps, dtype=dt)
        self.conv1 = eqx.nn.Conv2d(config.in_channels, c1, (3, 3), padding=1, key=k1, dtype=dt)
        self.bn1 = bn(c1) if config.batch_norm else None
        self.conv2 = eqx.nn.Conv2d(c1, c2, (3, 3), padding=1, key=k2, dtype=dt)
        self.bn2 = bn(c2) if config.batch_norm else None
        self.fc1 = eqx.nn.Linear(math.prod(config.flatten_shape), config.hidden, key=k3, dtype=dt)
        self.dropout = eqx.nn.Dropout(config.dropout)
        self.fc2 = eqx.nn.Linear(config.hidden, config.num_classes, key=k4, dtype=dt)
        self.pool = eqx.nn.AvgPool2d((2, 2), stride=(2, 2))
        self.config = config

    def __call__(
        self, x: Array, state: eqx.nn.State, *, key: PRNGKeyArray | None = None
    ) -> tuple[Array, eqx.nn.State]:
        for conv, bn in ((self.conv1, self.bn1), (self.conv2, self.bn2)):
            x = conv(x)
            if bn is not None:
                x, state = bn(x, state)
            x = self.pool(jax.nn.relu(x))
        x = self.fc1(x.reshape(-1))  # flattens (C, H, W), as PyTorch
        x = jax.nn.relu(self.dropout(x, key=key))
        return self.fc2(x), state
