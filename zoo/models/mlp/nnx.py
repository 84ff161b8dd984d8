"""MLP in Flax NNX: batched `(N, in_features)` input."""

from __future__ import annotations

from itertools import pairwise

import jax
from flax import nnx

from zoo.models.common import activation, dtype_of
from zoo.models.mlp.config import MLPConfig


class MLP(nnx.Module):
    def __init__(self, config: MLPConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        w, dt = config.widths, dtype_of(param_dtype)
        self.config = config
        self.layers = nnx.List([nnx.Linear(i, o, param_dtype=dt, rngs=rngs)
                                for i, o in pairwise(w)])

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        self.config.check_input(x.shape, channels_last=True)
        act = activation(self.config.activation)
        for layer in self.layers[:-1]:
            x = act(layer(x))
        return self.layers[-1](x)
