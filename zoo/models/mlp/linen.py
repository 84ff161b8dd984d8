"""MLP in Flax Linen: batched `(N, in_features)` input."""

from __future__ import annotations

import flax.linen as nn
import jax

from zoo.models.common import activation, dtype_of
from zoo.models.mlp.config import MLPConfig


class MLP(nn.Module):
    config: MLPConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        h1, h2 = self.config.hidden
        dense = lambda n: nn.Dense(n, param_dtype=dtype_of(self.param_dtype))
        self.fc1 = dense(h1)
        self.fc2 = dense(h2)
        self.fc3 = dense(self.config.out_features)

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        """`train` is accepted for a uniform signature: the MLP has no train-only layers."""
        act = activation(self.config.activation)
        x = act(self.fc1(x))
        x = act(self.fc2(x))
        return self.fc3(x)
