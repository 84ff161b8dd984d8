"""The canonical initialisation: one set of arrays, in PyTorch layout, for every library.

Scheme (PyTorch's defaults, drawn with NumPy so that it is identical on every platform and
costs no compilation): every layer gets its own generator,
``numpy.random.default_rng([seed, crc32(layer name)])`` (PCG64), which draws the weight and then
the bias. Linear, Conv and ConvTranspose weights and biases are ``U(-b, b)`` with
``b = 1/sqrt(fan_in)``, where ``fan_in = weight.shape[1] * prod(kernel)`` (for ConvTranspose
PyTorch's ``weight.shape[1]`` is out_channels / groups). BatchNorm: weight 1, bias 0,
running_mean 0, running_var 1, num_batches_tracked 0. Values are drawn in float64, rounded to
float32 and then cast to the requested dtype.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from zoo.configs import Config


def canonical_init(config: Config, seed: int = 0, dtype: Any = "float32") -> dict[str, np.ndarray]:
    """The canonical state of a freshly initialised model (numpy arrays)."""
    from converters.core import canonical_layers, canonical_spec

    spec = canonical_spec(config)
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
            rng = np.random.default_rng([seed, zlib.crc32(layer.name.encode())])
            values = {"weight": rng.uniform(-bound, bound, w_shape)}
            if layer.has_bias:
                values["bias"] = rng.uniform(-bound, bound, shape("bias"))
        for k, v in values.items():
            state[f"{layer.name}.{k}"] = np.asarray(v, np.float32).astype(dtype)
    return state
