"""MLP in Equinox: per-sample `(in_features,)` input."""

from __future__ import annotations

from itertools import pairwise

import equinox as eqx
import jax
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.eqx import Linear
from zoo.models.common import activation, dtype_of
from zoo.models.mlp.config import MLPConfig


class MLP(eqx.Module):
    layers: tuple[Linear, ...]
    config: MLPConfig = eqx.field(static=True)

    def __init__(self, config: MLPConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        w = config.widths
        keys = jax.random.split(key, len(w) - 1)
        self.layers = tuple(Linear(i, o, key=k, dtype=dtype_of(dtype))
                            for (i, o), k in zip(pairwise(w), keys, strict=True))
        self.config = config

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        self.config.check_input(x.shape, batched=False)
        act = activation(self.config.activation)
        for layer in self.layers[:-1]:
            x = act(layer(x))
        return self.layers[-1](x)
