"""MLP in Equinox: per-sample `(in_features,)` input."""

from __future__ import annotations

import equinox as eqx
import jax
from jaxtyping import Array, PRNGKeyArray

from zoo.models.common import activation, dtype_of
from zoo.models.mlp.config import MLPConfig


class MLP(eqx.Module):
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear
    fc3: eqx.nn.Linear
    config: MLPConfig = eqx.field(static=True)

    def __init__(self, config: MLPConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        h1, h2 = config.hidden
        dtype = dtype_of(dtype)
        self.fc1 = eqx.nn.Linear(config.in_features, h1, key=k1, dtype=dtype)
        self.fc2 = eqx.nn.Linear(h1, h2, key=k2, dtype=dtype)
        self.fc3 = eqx.nn.Linear(h2, config.out_features, key=k3, dtype=dtype)
        self.config = config

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        act = activation(self.config.activation)
        x = act(self.fc1(x))
        x = act(self.fc2(x))
        return self.fc3(x)
