"""FLOP counts that cannot lie silently.

`compiled.cost_analysis()` has returned no FLOPs, -1, an empty list or a list of dicts on GPUs in
some JAX versions (jax issues 16008, 20184, 22249); on an H100 (jax 0.11.2) it counted a
conv-transpose at 7,775 FLOPs instead of 5.75e10: the optimised GPU program calls cuDNN and
cuBLAS (custom calls the analysis does not see) and pads each layout its own way (ResNet-50:
Linen 1.082x Equinox). So every program is counted from up to three sources, each recorded
with its name, most trusted first:

- ``lowered``: the backend's cost analysis of the pre-optimisation HLO (`Lowered.cost_analysis`;
  PJRT plugins such as CUDA's do not implement it);
- ``cpu``: the same pre-optimisation HLO analysed by the host CPU client (or, failing that,
  compiled for it);
- ``compiled``: the backend's cost analysis of the optimised program (what runs): recorded as
  information, never compared (`COMPARED`).

The pre-optimisation HLO is the whole computation on every backend, before any library call or
layout padding: the fairness check compares programs, and checks the useful-FLOP floor, on it.

XLA's cost analysis counts the body of a loop once, whatever its trip count; a program that
runs its matrix multiplies in a `lax.scan` (the `im2col` conv-transpose) would be undercounted
by its trip count. `loop_flops` therefore reads each program's HLO text and adds, for every
`while` whose trip count it knows (XLA's `known_trip_count` in a compiled program; in the
pre-optimisation HLO, a counter from a constant compared `LT` to a constant), the FLOPs of the
dots of its body (nested loops, fusions and called computations included) times the trips the
analysis did not count.

A count is usable when it is a finite number > 0. Comparisons use the first compared source
that every program has (`common_source`); a program with no usable count is refused by the
fairness check rather than skipped.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator
from typing import Any

import jax

SOURCES: tuple[str, ...] = ("lowered", "cpu", "compiled")
# The sources the fairness check compares (the whole computation on every backend).
COMPARED: tuple[str, ...] = ("lowered", "cpu")


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


_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+)(?: \((.*)\) -> .*)? \{$")
_ARRAY = re.compile(r"%?([\w.\-]+): \w+\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = \w+\[([\d,]*)\]\S* ([\w\-]+)\((.*)$")
_WHILE = re.compile(r" while\(.*?condition=%?([\w.\-]+), body=%?([\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CALLS = re.compile(r"(?:calls|to_apply)=%?([\w.\-]+)")
_CONSTANT = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = s(?:32|64)\[\]\S* constant\((-?\d+)\)")
_COMPARE_LT = re.compile(r"^\s*ROOT %?[\w.\-]+ = pred\[\]\S* compare\(%?([\w.\-]+), "
                         r"%?([\w.\-]+)\), direction=LT")
_GTE = re.compile(r"^\s*%?([\w.\-]+) = s(?:32|64)\[\]\S* get-tuple-element\(%?[\w.\-]+\), "
                  r"index=(\d+)")
_TUPLE = re.compile(r"^\s*%?([\w.\-]+) = \(.*\) tuple\((.*)\)\s*$")


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


def _computations(hlo: str) -> Iterator[tuple[str, list[str], dict[str, tuple[int, ...]]]]:
    """(name, instruction lines, array shapes by name) of every computation of an HLO text."""
    name, lines, shapes = None, [], {}
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header:
            name, lines = header.group(1), []
            shapes = {m.group(1): _dims(m.group(2))
                      for m in _ARRAY.finditer(header.group(2) or "")}
        elif name is not None and line.strip() == "}":
            yield name, lines, shapes
            name = None
        elif name is not None:
            lines.append(line)
            inst = _INSTRUCTION.match(line)
            if inst:
                shapes[inst.group(1)] = _dims(inst.group(2))


def _dot_flops(line: str, shapes: dict[str, tuple[int, ...]]) -> float:
    """2 * output elements * contracted size of one `dot` instruction line (0 otherwise)."""
    inst = _INSTRUCTION.match(line)
    if not inst or inst.group(3) != "dot":
        return 0.0
    lhs = shapes.get(inst.group(4).split(",")[0].strip().lstrip("%"))
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line)
    if lhs is None or contracting is None:
        return 0.0
    return 2.0 * math.prod(_dims(inst.group(2))) * math.prod(
        lhs[i] for i in _dims(contracting.group(1)))


def _constants(lines: list[str]) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for line in lines if (m := _CONSTANT.match(line))}


def _counted_trips(line: str, lines: list[str],
                   comps: dict[str, tuple[list[str], Any]]) -> int | None:
    """The trip count of the `while` on `line` (of the computation `lines`): XLA's
    `known_trip_count`, else, in a pre-optimisation program, `(limit - start)` of a counter
    tuple element compared `LT` to the constant `limit` by the condition, started at the
    constant `start` of the operand tuple. None when neither is found."""
    known = _TRIPS.search(line)
    if known:
        return int(known.group(1))
    loop = _WHILE.search(line)
    cond = comps.get(loop.group(1), ([], {}))[0] if loop else []
    compare = next((m for c in cond if (m := _COMPARE_LT.match(c))), None)
    operand = re.search(r" while\(%?([\w.\-]+)\)", line)
    if compare is None or operand is None:
        return None
    limit = _constants(cond).get(compare.group(2))
    index = next((int(m.group(2)) for c in cond
                  if (m := _GTE.match(c)) and m.group(1) == compare.group(1)), None)
    init = next((m.group(2) for c in lines
                 if (m := _TUPLE.match(c)) and m.group(1) == operand.group(1)), None)
    if limit is None or index is None or init is None:
        return None
    names = [a.strip().lstrip("%") for a in init.split(",")]
    start = _constants(lines).get(names[index]) if index < len(names) else None
    return None if start is None else max(0, limit - start)


def loop_flops(hlo: str) -> float:
    """The dot FLOPs of loop trips that XLA's cost analysis leaves out (it counts a loop body
    once): for every `while` whose trip count `n` is known (`_counted_trips`), (n - 1) times
    its body's dot FLOPs, nested loops multiplied through. 0.0 for a program without loops."""
    comps = {name: (lines, shapes) for name, lines, shapes in _computations(hlo)}
    entry = next((m.group(1) for line in hlo.splitlines()
                  if line.startswith("ENTRY") and (m := _HEADER.match(line))), None)

    @functools.cache
    def dots(name: str, trips: bool) -> float:
        lines, shapes = comps.get(name, ([], {}))
        total = 0.0
        for line in lines:
            total += _dot_flops(line, shapes)
            loop = _WHILE.search(line)
            if loop:
                n = _counted_trips(line, lines, comps) if trips else None
                total += (n if n is not None else 1) * dots(loop.group(2), trips)
            else:
                total += sum(dots(callee, trips) for callee in _CALLS.findall(line))
        return total

    return 0.0 if entry is None else dots(entry, True) - dots(entry, False)


def _loop_extra(text: Any) -> float:
    """`loop_flops` of the HLO text `text()` returns (0.0 when the backend gives none)."""
    try:
        return loop_flops(text())
    except Exception:  # no HLO text from this backend: loops stay counted once
        return 0.0


def count(lowered: Any, compiled: Any = None) -> dict[str, tuple[float, float | None]]:
    """source -> (flops, bytes accessed) for every source that gave a usable FLOP count.

    The compiled program is counted when given (information: `COMPARED` leaves it out); a
    pre-optimisation count (``lowered``, else ``cpu``) is always added. Each source gets the
    loop trips its analysis leaves out, read from the HLO it analysed (`loop_flops`): the
    pre-optimisation HLO holds the whole (global, unpartitioned) computation, the compiled one
    one device's share.
    """
    out: dict[str, tuple[float, float | None]] = {}
    compiled = jax_compiled(compiled)
    if compiled is not None:
        flops, nbytes = _call(compiled.cost_analysis)
        if flops:
            out["compiled"] = (flops + _loop_extra(compiled.as_text), nbytes)
    lowered = _unwrap(lowered, "lowered")
    if lowered is not None:
        flops, nbytes = _call(lowered.cost_analysis)
        source = "lowered"
        if not flops:
            (flops, nbytes), source = _call(lambda: _cpu_analysis(lowered)), "cpu"
        if flops:
            extra = _loop_extra(lambda: lowered.as_text(dialect="hlo"))
            out[source] = (flops + extra, nbytes)
    return out


def program_devices(compiled: Any) -> int:
    """How many devices the compiled program runs on (1 when it does not say)."""
    try:
        shardings = jax.tree.leaves(compiled.input_shardings)
    except Exception:
        return 1
    return max((getattr(s, "num_devices", 1) for s in shardings), default=1)


def common_source(counts: dict[str, dict[str, Any]],
                  sources: tuple[str, ...] = COMPARED) -> str | None:
    """The first of `sources` that every program in `counts` has."""
    for source in sources:
        if counts and all(source in c for c in counts.values()):
            return source
    return None


def best(counts: dict[str, Any]) -> tuple[str | None, Any]:
    """(source, value) of the preferred source present in `counts` (`SOURCES` order)."""
    for source in SOURCES:
        if source in counts:
            return source, counts[source]
    return None, None
