"""The precision policy: where exactness is claimed, and the one tolerance table.

- **Exactness** (tests, `--verify`, the benchmark's strict fairness pass) is claimed at full
  float32: `jax.default_matmul_precision("highest")` for JAX, IEEE float32 for PyTorch matmuls and
  cuDNN convolutions (`exact()`; `set_global("highest")` for a whole process, as the test suite
  does). Without it, JAX runs float32 dots and convolutions in TF32 on Ampere and newer GPUs and
  PyTorch lets cuDNN convolutions use TF32.
- **Other precisions** (`use("default" | "high")`) compute float32 in a narrower format, given by
  `compute_format`, and earn a tolerance derived from that format's mantissa.
- **Tolerances** come from one formula, never from ad-hoc numbers: with eps(f) = 2^-mantissa
  bits of the compute format f (float32 23, TF32 10, float16 10, bfloat16 7),
  ``tol = r * eps(f) + a * eps(accumulator)``, where the accumulator is float32 (float64 for
  float64): `r` covers the rounding of inputs and outputs to f, `a` the reduction order (each
  library and backend sums in its own order). `KINDS` holds (r, a) per kind of comparison.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

PRECISIONS: tuple[str, ...] = ("default", "high", "highest")
EXACT = "highest"
ENV_VAR = "JAX_DEFAULT_MATMUL_PRECISION"  # read by JAX at start-up (subprocesses)

# Explicit mantissa bits of each compute format.
MANTISSA_BITS: dict[str, int] = {"float64": 52, "float32": 23, "tf32": 10, "float16": 10,
                                 "bfloat16": 7}


@dataclass(frozen=True)
class Kind:
    """A kind of comparison: `rounding` eps of the compute format + `accumulation` eps of the
    accumulator."""

    rounding: float
    accumulation: float
    doc: str


KINDS: dict[str, Kind] = {
    # Per element, as rtol = atol (tests: layers, models, gradients, optimizer states).
    "elementwise": Kind(4, 80, "rtol = atol per element"),
    # max |a - b| / max |reference| over a whole model output (the benchmark's fairness check).
    "max_relative": Kind(8, 800, "max |a - b| / max |reference|"),
}


def compute_format(dtype: Any, precision: str = EXACT, backend: str | None = None) -> str:
    """The format float arithmetic of `dtype` effectively runs in at `precision` on `backend`.

    float32 at "highest" is float32 everywhere; at "default" or "high" it is TF32 on GPUs (JAX,
    and cuDNN convolutions in PyTorch), bfloat16 on TPUs at "default" (bf16_3x at "high", at
    least as accurate as TF32), float32 on CPUs (XLA:CPU and PyTorch ignore the setting).
    """
    check_precision(precision)
    name = jnp.dtype(dtype).name
    if name != "float32" or precision == EXACT:
        return name
    backend = backend or jax.default_backend()
    if backend == "cpu":
        return "float32"
    if backend == "tpu" and precision == "default":
        return "bfloat16"
    return "tf32"


def tolerance(dtype: Any, precision: str = EXACT, *, kind: str = "elementwise",
              backend: str | None = None) -> float:
    """The tolerance of a `kind` comparison of `dtype` results computed at `precision`."""
    fmt = compute_format(dtype, precision, backend)
    if fmt not in MANTISSA_BITS:
        raise ValueError(f"dtype {jnp.dtype(dtype).name!r} has no tolerance; the policy knows "
                         f"{sorted(MANTISSA_BITS)}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    k = KINDS[kind]
    eps = 2.0 ** -MANTISSA_BITS[fmt]
    return k.rounding * eps + k.accumulation * min(eps, 2.0 ** -MANTISSA_BITS["float32"])


def allclose(dtype: Any, precision: str = EXACT, backend: str | None = None) -> dict[str, float]:
    """`rtol`/`atol` keyword arguments (numpy, chex) for elementwise comparisons."""
    tol = tolerance(dtype, precision, backend=backend)
    return {"rtol": tol, "atol": tol}


def table(backend: str | None = None) -> list[dict[str, Any]]:
    """Every (dtype, precision) with its compute format and tolerances (for docs and records)."""
    rows = []
    for dtype in ("float32", "bfloat16", "float16"):
        for precision in PRECISIONS:
            rows.append({"dtype": dtype, "precision": precision,
                         "format": compute_format(dtype, precision, backend),
                         **{k: tolerance(dtype, precision, kind=k, backend=backend)
                            for k in KINDS}})
    return rows


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


# --------------------------------------------------------------------------- applying it
def _torch_flags(torch: Any) -> list[tuple[Any, str, Any, Any]]:
    """(object, attribute, IEEE value, TF32 value) of PyTorch's float32 precision flags: the
    current ones (`fp32_precision`, PyTorch >= 2.9), else the older `allow_tf32` ones (the two
    must not be mixed)."""
    matmul, conv = torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(matmul, "fp32_precision"):
        return [(matmul, "fp32_precision", "ieee", "tf32"),
                (conv, "fp32_precision", "ieee", "tf32")]
    return [(matmul, "allow_tf32", False, True), (torch.backends.cudnn, "allow_tf32", False, True)]


TORCH_FLAG_NAMES = ("cuda.matmul", "cudnn.conv")


@contextlib.contextmanager
def _torch_precision(precision: str) -> Iterator[None]:
    torch = sys.modules.get("torch")
    if torch is None or precision == "default":
        yield
        return
    flags = _torch_flags(torch)
    saved = [getattr(obj, attr) for obj, attr, *_ in flags]
    for obj, attr, ieee, tf32 in flags:
        setattr(obj, attr, ieee if precision == EXACT else tf32)
    try:
        yield
    finally:
        for (obj, attr, *_), value in zip(flags, saved, strict=True):
            setattr(obj, attr, value)


@contextlib.contextmanager
def use(precision: str) -> Iterator[None]:
    """Run JAX (and PyTorch, if imported) at `precision`; "default" leaves both untouched.

    JAX programs traced inside are compiled for this precision (it is part of jit's cache key).
    """
    check_precision(precision)
    jax_ctx = (contextlib.nullcontext() if precision == "default"
               else jax.default_matmul_precision(precision))
    with jax_ctx, _torch_precision(precision):
        yield


def exact() -> contextlib.AbstractContextManager[None]:
    """Full float32 in JAX and PyTorch: the precision at which exactness is claimed."""
    return use(EXACT)


def set_global(precision: str = EXACT) -> None:
    """Apply `precision` for the rest of the process and its subprocesses (the test suite)."""
    check_precision(precision)
    if precision == "default":
        return
    jax.config.update("jax_default_matmul_precision", precision)
    os.environ[ENV_VAR] = precision
    torch = sys.modules.get("torch")
    if torch is not None:
        for obj, attr, ieee, tf32 in _torch_flags(torch):
            setattr(obj, attr, ieee if precision == EXACT else tf32)


def current() -> dict[str, Any]:
    """The precision settings in effect (for benchmark records)."""
    out: dict[str, Any] = {"jax_default_matmul_precision":
                           jax.config.jax_default_matmul_precision}
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            out["torch"] = {f"{name}.{attr}": getattr(obj, attr) for name, (obj, attr, *_)
                            in zip(TORCH_FLAG_NAMES, _torch_flags(torch), strict=True)}
    return out
