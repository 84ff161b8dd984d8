"""The canonical initialisation: one set of arrays, in PyTorch layout, for every library.

Every layer gets its own generator, ``numpy.random.default_rng([seed, crc32(layer name)])``
(PCG64), and its kind's `init` draws its canonical arrays from it (PyTorch's defaults, see
`canonical.rules`: Linear, Conv and ConvTranspose weights then biases ``U(-b, b)`` with
``b = 1/sqrt(weight.shape[1] * prod(kernel))``; BatchNorm weight 1, bias 0, running_mean 0,
running_var 1, num_batches_tracked 0). An architecture whose reference initialises some kinds
otherwise replaces their `init` in its config (`Config.KIND_INITS`: the language models take
transformers' N(0, 0.02) weights and zero biases). Drawn with NumPy in float64, so that it is
identical on every platform and costs no compilation, rounded to float32 and then cast to the
requested dtype.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection
from typing import Any

import numpy as np

from canonical import KINDS
from canonical.state import split_by_layer
from zoo.configs import Config
from zoo.registry import schema


def canonical_init(config: Config, seed: int = 0, dtype: Any = "float32",
                   only: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """The canonical state of a freshly initialised model (numpy arrays); with `only` (keys),
    just the layers holding those keys (the same values as in the whole state)."""
    layers, spec = schema(config)
    dtype = np.dtype(dtype)
    shapes = split_by_layer({k: tuple(v.shape) for k, v in spec.items()}, layers)
    state: dict[str, np.ndarray] = {}
    for layer in layers:
        if only is not None and not any(k == layer.name or k.startswith(layer.name + ".")
                                        for k in only):
            continue
        rng = np.random.default_rng([seed, zlib.crc32(layer.name.encode())])
        init = type(config).KIND_INITS.get(layer.kind, KINDS[layer.kind].init)
        values = init(shapes[layer.name], rng)
        for k, v in values.items():
            key = f"{layer.name}.{k}" if k else layer.name
            v = np.asarray(v)
            state[key] = v if np.issubdtype(v.dtype, np.integer) else (
                v.astype(np.float32).astype(dtype))
    return state
