"""Tolerances for tests: a thin delegate to the precision policy (`zoo.precision`)."""

from __future__ import annotations

from typing import Any

from zoo import precision


def tolerance(dtype: Any, precision_: str = precision.EXACT) -> dict[str, float]:
    """`rtol`/`atol` keyword arguments for `chex.assert_trees_all_close` at `dtype`, computed at
    `precision_` (default: full float32, where exactness is claimed)."""
    return precision.allclose(dtype, precision_)
