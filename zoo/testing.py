"""Numerical tolerances for comparing implementations, stated once per dtype.

Measured on CPU (see docs/conventions.md): float32 layers agree to ~2e-6, end-to-end models to
~1e-7 in outputs and ~5e-7 in gradients. The bounds below leave headroom for other backends and
for accumulation-order differences (XLA may reduce in another order per library).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

TOLERANCES: dict[str, dict[str, float]] = {
    "float32": {"rtol": 1e-5, "atol": 1e-5},
    "float16": {"rtol": 5e-3, "atol": 5e-3},
    "bfloat16": {"rtol": 3e-2, "atol": 3e-2},
}


def tolerance(dtype: Any) -> dict[str, float]:
    """`rtol`/`atol` keyword arguments for `chex.assert_trees_all_close` at `dtype`."""
    return TOLERANCES[jnp.dtype(dtype).name]
