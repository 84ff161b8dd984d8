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
        dt = dtype_of(self.param_dtype)
        self.layers = [nn.Dense(n, param_dtype=dt) for n in self.config.widths[1:]]

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        """`train` is accepted for a uniform signature: the MLP has no train-only layers."""
        self.config.check_input(x.shape, channels_last=True)
        act = activation(self.config.activation)
        for layer in self.layers[:-1]:
            x = act(layer(x))
        return self.layers[-1](x)
