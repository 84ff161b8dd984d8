"""MLP in Flax NNX: batched `(N, in_features)` input."""

from __future__ import annotations

import jax
from flax import nnx

from zoo.models.common import activation, dtype_of
from zoo.models.mlp.config import MLPConfig


class MLP(nnx.Module):
    def __init__(self, config: MLPConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        h1, h2 = config.hidden
        dt = dtype_of(param_dtype)
        self.config = config
        self.fc1 = nnx.Linear(config.in_features, h1, param_dtype=dt, rngs=rngs)
        self.fc2 = nnx.Linear(h1, h2, param_dtype=dt, rngs=rngs)
        self.fc3 = nnx.Linear(h2, config.out_features, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        act = activation(self.config.activation)
        x = act(self.fc1(x))
        x = act(self.fc2(x))
        return self.fc3(x)
