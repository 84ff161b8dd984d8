"""Run any native model (zoo-built or not) in eval mode on a canonical input, and compare two."""

from __future__ import annotations

from typing import Any

import numpy as np

from canonical.errors import ConversionError
from zoo.libraries import native_interface
from zoo.runtime import precision


def forward(model: Any, impl: str, x: np.ndarray, config: Any = None) -> np.ndarray:
    """The eval-mode output of `model` on the batch `x` (canonical layout `(N, C, *spatial)`;
    token ids stay integers), in the canonical layout (`config`: the model's, for the layout
    of token models). The caller's model is not changed (see `Interface.forward`)."""
    api = native_interface(impl)
    x = np.asarray(x)
    x = x if np.issubdtype(x.dtype, np.integer) else x.astype(np.float32)
    with precision.exact():
        y = api.forward(model, api.to_native(x, config))
    return api.to_canonical(np.asarray(y[0] if isinstance(y, tuple) else y, np.float64),
                            config)


def max_difference(reference: np.ndarray, other: np.ndarray) -> float:
    """max |a - b| / max |reference| (the precision policy's `max_relative` comparison)."""
    if reference.shape != other.shape:
        raise ConversionError(f"verification: the outputs differ in shape: {reference.shape} "
                              f"and {other.shape}")
    scale = max(float(np.abs(reference).max()), 1e-30)
    return float(np.abs(reference - other).max()) / scale


def tolerance() -> float:
    return precision.tolerance("float32", kind="max_relative")


def random_input(input_shape: tuple[int, ...], batch: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, *input_shape)).astype(np.float32)


def sample_input(config: Any, batch: int = 2, seed: int = 0) -> np.ndarray:
    """A random batch for `config`'s model: `random_input`, or its own token ids where its
    inputs are integers (`Config.INPUT_DTYPE`)."""
    if np.issubdtype(np.dtype(config.INPUT_DTYPE), np.integer):
        import jax

        return np.asarray(config.sample_input(jax.random.key(seed), batch))
    return random_input(config.input_shape, batch, seed)
