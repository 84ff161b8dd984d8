"""FLOP counts that cannot lie silently.

`compiled.cost_analysis()` has returned no FLOPs, -1, an empty list or a list of dicts on GPUs in
some JAX versions (jax issues 16008, 20184, 22249). A FLOP check fed such a number would crash or
pass without checking anything. So every program is counted from up to three sources, each
recorded with its name:

- ``compiled``: the backend's cost analysis of the optimised program (what runs);
- ``lowered``: the backend's cost analysis of the pre-optimisation HLO (`Lowered.cost_analysis`;
  PJRT plugins such as CUDA's do not implement it);
- ``cpu``: the same pre-optimisation HLO analysed by the host CPU client (or, failing that,
  compiled for it).

A count is usable when it is a finite number > 0. Comparisons use the first source that every
compared program has (`common_source`); a program with no usable count at all is refused by the
fairness check rather than skipped.
"""

from __future__ import annotations

import math
from typing import Any

SOURCES: tuple[str, ...] = ("compiled", "lowered", "cpu")


def _unwrap(obj: Any, attr: str) -> Any:
    """The JAX stage object inside an Equinox or NNX wrapper (`.compiled`, `.lowered`)."""
    for _ in range(4):
        if obj is None or hasattr(obj, "cost_analysis"):
            return obj
        obj = getattr(obj, attr, None)
    return None


def jax_compiled(obj: Any) -> Any:
    """The `jax.stages.Compiled` inside an Equinox or NNX wrapper (or the object itself)."""
    return _unwrap(obj, "compiled")


def usable(value: Any) -> float | None:
    """`value` as a float if it is a finite number > 0, else None."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def parse(analysis: Any) -> tuple[float | None, float | None]:
    """(flops, bytes accessed) from a cost analysis: a dict, a list of dicts, or nothing."""
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if analysis else None
    if not isinstance(analysis, dict):
        return None, None
    return usable(analysis.get("flops")), usable(analysis.get("bytes accessed"))


def _call(fn: Any) -> tuple[float | None, float | None]:
    try:
        return parse(fn())
    except Exception:  # a backend may raise instead of returning nothing
        return None, None


def _cpu_analysis(lowered: Any) -> Any:
    """Cost analysis of `lowered`'s pre-optimisation HLO by the host CPU client (private JAX
    APIs, hence guarded): the HLO module analysed directly, else its StableHLO compiled."""
    from jax.extend.backend import get_backend, get_compile_options

    cpu = get_backend("cpu")
    try:
        from jax._src.lib import _jax

        return _jax.hlo_module_cost_analysis(cpu, lowered._lowering.hlo().as_hlo_module())
    except Exception:
        options = get_compile_options(num_replicas=1, num_partitions=1)
        return cpu.compile_and_load(lowered.as_text(), cpu.devices()[:1],
                                    options).cost_analysis()


def count(lowered: Any, compiled: Any = None) -> dict[str, tuple[float, float | None]]:
    """source -> (flops, bytes accessed) for every source that gave a usable FLOP count.

    The compiled program is counted when given; a pre-optimisation count (``lowered``, else
    ``cpu``) is always added, so that programs whose compiled counts are missing can still be
    compared with the others on a common source.
    """
    out: dict[str, tuple[float, float | None]] = {}
    compiled = jax_compiled(compiled)
    if compiled is not None:
        flops, nbytes = _call(compiled.cost_analysis)
        if flops:
            out["compiled"] = (flops, nbytes)
    lowered = _unwrap(lowered, "lowered")
    if lowered is not None:
        flops, nbytes = _call(lowered.cost_analysis)
        if flops:
            out["lowered"] = (flops, nbytes)
        else:
            flops, nbytes = _call(lambda: _cpu_analysis(lowered))
            if flops:
                out["cpu"] = (flops, nbytes)
    return out


def common_source(counts: dict[str, dict[str, Any]]) -> str | None:
    """The first source (in `SOURCES` order) that every program in `counts` has."""
    for source in SOURCES:
        if counts and all(source in c for c in counts.values()):
            return source
    return None


def best(counts: dict[str, Any]) -> tuple[str | None, Any]:
    """(source, value) of the preferred source present in `counts`."""
    for source in SOURCES:
        if source in counts:
            return source, counts[source]
    return None, None
