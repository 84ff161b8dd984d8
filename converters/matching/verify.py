"""Run any native model (zoo-built or not) in eval mode on a canonical input, and compare two."""

from __future__ import annotations

from typing import Any

import numpy as np

from canonical.errors import ConversionError
from zoo.libraries import native_interface
from zoo.runtime import precision


def forward(model: Any, impl: str, x: np.ndarray) -> np.ndarray:
    """The eval-mode output of `model` on the batch `x` (canonical layout `(N, C, *spatial)`),
    in the canonical layout. The caller's model is not changed (see `Interface.forward`)."""
    api = native_interface(impl)
    with precision.exact():
        y = api.forward(model, api.to_native(np.asarray(x, np.float32)))
    return api.to_canonical(np.asarray(y[0] if isinstance(y, tuple) else y, np.float64))


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
