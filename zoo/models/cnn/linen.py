"""CNN in Flax Linen: batched `(N, H, W, C)` input, statistics in the `batch_stats` collection."""

from __future__ import annotations

import flax.linen as nn
import jax

from zoo.models.cnn.config import CNNConfig
from zoo.models.common import dtype_of


class CNN(nn.Module):
    config: CNNConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        self.convs = [nn.Conv(c, (3, 3), padding=((1, 1), (1, 1)), param_dtype=dt)
                      for c in cfg.features]
        self.bns = [nn.BatchNorm(momentum=cfg.bn_momentum, epsilon=cfg.bn_eps,
                                 use_fast_variance=False, param_dtype=dt)
                    for _ in cfg.features] if cfg.batch_norm else []
        self.fc1 = nn.Dense(cfg.hidden, param_dtype=dt)
        self.dropout = nn.Dropout(cfg.dropout)
        self.fc2 = nn.Dense(cfg.num_classes, param_dtype=dt)

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        self.config.check_input(x.shape, channels_last=True)
        for i, conv in enumerate(self.convs):
            x = conv(x)
            if self.bns:
                x = self.bns[i](x, use_running_average=not train)
            x = nn.avg_pool(nn.relu(x), (2, 2), strides=(2, 2))
        x = self.fc1(x.reshape(x.shape[0], -1))  # flattens (H, W, C): see converters
        x = nn.relu(self.dropout(x, deterministic=not train))
        return self.fc2(x)
