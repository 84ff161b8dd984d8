"""The canonical initialisation: one set of arrays, in PyTorch layout, for every library.

Scheme (PyTorch's defaults, drawn with JAX's counter-based PRNG so it is identical everywhere):
every layer gets its own key, ``fold_in(key(seed), crc32(layer name))``, split into a weight
key and a bias key. Linear, Conv and ConvTranspose weights and biases are ``U(-b, b)`` with
``b = 1/sqrt(fan_in)``, where ``fan_in = weight.shape[1] * prod(kernel)`` (for ConvTranspose
PyTorch's ``weight.shape[1]`` is out_channels / groups). BatchNorm: weight 1, bias 0,
running_mean 0, running_var 1, num_batches_tracked 0. Values are drawn in float32 and then cast.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import jax
import numpy as np

from zoo.configs import Config


def canonical_init(config: Config, seed: int = 0, dtype: Any = "float32") -> dict[str, np.ndarray]:
    """The canonical state of a freshly initialised model (numpy arrays)."""
    from converters.core import canonical_layers, canonical_spec

    spec = canonical_spec(config)
    root = jax.random.key(seed)
    dtype = np.dtype(dtype)
    state: dict[str, np.ndarray] = {}
    for layer in canonical_layers(config):
        shape = lambda k, n=layer.name: tuple(spec[f"{n}.{k}"].shape)
        if layer.kind == "batch_norm":
            (c,) = shape("weight")
            values = {"weight": np.ones(c), "bias": np.zeros(c), "running_mean": np.zeros(c),
                      "running_var": np.ones(c)}
            state[f"{layer.name}.num_batches_tracked"] = np.zeros((), np.int64)
        else:
            w_shape = shape("weight")
            bound = 1.0 / math.sqrt(math.prod(w_shape[1:]))
            kw, kb = jax.random.split(jax.random.fold_in(root, zlib.crc32(layer.name.encode())))
            values = {"weight": jax.random.uniform(kw, w_shape, minval=-bound, maxval=bound)}
            if layer.has_bias:
                values["bias"] = jax.random.uniform(kb, shape("bias"), minval=-bound,
                                                    maxval=bound)
        for k, v in values.items():
            state[f"{layer.name}.{k}"] = np.asarray(v, np.float32).astype(dtype)
    return state
