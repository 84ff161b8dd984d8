"""CNN in Equinox: per-sample `(C, H, W)` input, BatchNorm statistics in `eqx.nn.State`."""

from __future__ import annotations

import math
from itertools import pairwise
from typing import ClassVar

import equinox as eqx
import jax
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.eqx import BatchNorm, Linear
from zoo.models.cnn.config import CNNConfig
from zoo.models.common import dtype_of


class CNN(eqx.Module):
    has_state: ClassVar[bool] = True  # zoo.create returns (model, state)

    convs: tuple[eqx.nn.Conv2d, ...]
    bns: tuple[BatchNorm, ...]  # empty without batch_norm
    fc1: Linear
    dropout: eqx.nn.Dropout
    fc2: Linear
    pool: eqx.nn.AvgPool2d
    config: CNNConfig = eqx.field(static=True)

    def __init__(self, config: CNNConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        *keys, k1, k2 = jax.random.split(key, len(config.features) + 2)
        c, dt = (config.in_channels, *config.features), dtype_of(dtype)
        self.convs = tuple(eqx.nn.Conv2d(i, o, (3, 3), padding=1, key=k, dtype=dt)
                           for (i, o), k in zip(pairwise(c), keys, strict=True))
        self.bns = tuple(BatchNorm(o, "batch", config.bn_momentum, config.bn_eps, dtype=dt)
                         for o in config.features) if config.batch_norm else ()
        self.fc1 = Linear(math.prod(config.flatten_shape), config.hidden, key=k1, dtype=dt)
        self.dropout = eqx.nn.Dropout(config.dropout)
        self.fc2 = Linear(config.hidden, config.num_classes, key=k2, dtype=dt)
        self.pool = eqx.nn.AvgPool2d((2, 2), stride=(2, 2))
        self.config = config

    def __call__(
        self, x: Array, state: eqx.nn.State, *, key: PRNGKeyArray | None = None
    ) -> tuple[Array, eqx.nn.State]:
        self.config.check_input(x.shape, batched=False)
        for i, conv in enumerate(self.convs):
            x = conv(x)
            if self.bns:
                x, state = self.bns[i](x, state)
            x = self.pool(jax.nn.relu(x))
        x = self.fc1(x.reshape(-1))  # flattens (C, H, W), as PyTorch
        x = jax.nn.relu(self.dropout(x, key=key))
        return self.fc2(x), state
