"""The precision policy's comparisons for tests (`zoo.runtime.precision` holds the tolerances).

One comparison for values that can be near zero (gradients, logits, activations): each element
within `tol * |desired| + tol * scale`, where `scale = max(1, max|desired|)` is the largest
magnitude of the array it belongs to. Float32 rounding error grows with the magnitudes summed,
not with the element's own value: an element that cancels to ~0 in an array whose entries reach
15 carries ~1e-6 of absolute error from a different reduction order, and judging it against its
own size fails at random (issue 52). `tests/test_tolerances.py` keeps literal tolerances out of
the suite.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from zoo.runtime import precision

# The pins the suite's version-dependent facts were measured on (the repository's checkout).
PIN_FILES = tuple(Path(__file__).resolve().parents[1] / "requirements" / name
                  for name in ("constraints.txt", "torch.txt"))


def tolerance(dtype: Any, precision_: str = precision.EXACT) -> dict[str, float]:
    """`rtol`/`atol` keyword arguments for `chex.assert_trees_all_close` at `dtype`, computed at
    `precision_` (default: full float32, where exactness is claimed). Unscaled: for values of
    order one or bitwise-close ones; `assert_close` for anything that can cancel to zero."""
    return precision.allclose(dtype, precision_)


def scaled_tolerance(desired: Any, dtype: Any = "float32",
                     precision_: str = precision.EXACT) -> dict[str, float]:
    """`rtol`/`atol` for comparing against `desired`: the policy's tolerance, its absolute part
    scaled by `max(1, max|desired|)`."""
    tol = precision.tolerance(dtype, precision_)
    scale = max(1.0, float(np.max(np.abs(np.asarray(desired, np.float64)), initial=0.0)))
    return {"rtol": tol, "atol": tol * scale}


def assert_close(actual: Any, desired: Any, dtype: Any = "float32",
                 precision_: str = precision.EXACT, err_msg: str = "") -> None:
    """Every leaf of `actual` close to the same leaf of `desired` by `scaled_tolerance` (each
    leaf scaled by its own largest magnitude); the failing leaf is named by its path."""
    want = jax.tree_util.tree_leaves_with_path(desired)
    got = jax.tree_util.tree_leaves_with_path(actual)
    paths = [[jax.tree_util.keystr(p) for p, _ in tree] for tree in (got, want)]
    if paths[0] != paths[1]:  # the same leaves in the same order (a list may stand for a tuple)
        only = [" ".join(sorted(set(a) - set(b))[:5]) or "-" for a, b in (paths, paths[::-1])]
        raise AssertionError(f"{err_msg}: leaves differ: {len(got)} against {len(want)}, "
                             f"only in actual {only[0]}, only in desired {only[1]}".lstrip(": "))
    for (_, a), (path, d) in zip(got, want, strict=True):
        d = np.asarray(d, np.float64)
        where = " ".join(s for s in (err_msg, jax.tree_util.keystr(path)) if s)
        np.testing.assert_allclose(np.asarray(a, np.float64), d, err_msg=where,
                                   **scaled_tolerance(d, dtype, precision_))


def pins() -> dict[str, str]:
    """`package -> version` pinned in requirements/constraints.txt and requirements/torch.txt."""
    found = {}
    for path in PIN_FILES:
        if path.is_file():
            for line in path.read_text().splitlines():
                if match := re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*(\S+)\s*(#.*)?", line):
                    found[match[1].lower()] = match[2]
    return found


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@contextlib.contextmanager
def pinned_fact(*packages: str) -> Iterator[None]:
    """A fact of the `packages`' behaviour, pinned at their versions in requirements/: an
    AssertionError inside says so ("fact pinned at jaxlib 0.10.2 no longer holds on jaxlib
    0.11.0: ..."), so that an upstream release reads as one. Also a decorator; in tests, the
    marker `@pytest.mark.pinned(*packages)` (tests/conftest.py)."""
    try:
        yield
    except AssertionError as error:
        pinned = pins()
        was = ", ".join(f"{p} {pinned.get(p.lower(), '(unpinned)')}" for p in packages)
        now = ", ".join(f"{p} {_installed(p)}" for p in packages)
        same = all(pinned.get(p.lower()) == _installed(p) for p in packages)
        where = "the pinned versions themselves" if same else now
        raise AssertionError(f"fact pinned at {was} no longer holds on {where}: {error}") \
            from error
