"""The benchmark on a device mesh (`python -m zoo.bench ARCH --mesh 8 --strategy fsdp`).

- `--mesh N` (a "data" axis) or `--mesh DxM` ("data" x "model"); on the CPU the N host devices
  are asked for before JAX starts its backend (`request_devices`).
- Bytes per device from the arrays' shardings (`addressable_shards`), not from timings.
- Collectives of the compiled program: counted, with their result bytes, in its optimised HLO
  (`compiled.as_text()`), and their share of the op time in a `jax.profiler` trace of a few
  steps (the events named after the program's HLO instructions).
"""

from __future__ import annotations

import glob
import math
import os
import re
import tempfile
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from zoo.bench.xla_flags import backend_started
from zoo.runtime import sharding

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
AXES = {1: (sharding.DATA,), 2: (sharding.DATA, sharding.MODEL)}
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
HLO_METHOD = "compiled HLO: collective ops and their result bytes, per device"
PROFILE_METHOD = ("jax.profiler trace: time in collective HLO ops / time in all HLO ops, "
                  "summed over the devices' threads")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2,
                "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8,
                "c64": 8, "c128": 16}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\(")
_SHAPE = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")


class MeshError(ValueError):
    """A mesh the run cannot use: a bad `--mesh`, too few devices, a batch it does not split,
    a strategy with nothing to split, a subject that is not sharded."""


def parse_mesh(value: str) -> tuple[int, ...]:
    """`"8"` -> (8,) (data), `"4x2"` -> (4, 2) (data x model)."""
    parts = value.lower().split("x")
    if not 1 <= len(parts) <= 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise MeshError(f"--mesh: expected N or DATAxMODEL (e.g. 8 or 4x2), got {value!r}")
    return tuple(int(p) for p in parts)


def label(shape: tuple[int, ...] | list[int]) -> str:
    """"8 (data)", "4x2 (data x model)"."""
    return f"{'x'.join(map(str, shape))} ({' x '.join(AXES[len(shape)])})"


def request_devices(n: int) -> str | None:
    """Before JAX's backend starts: ask the CPU platform for `n` host devices (XLA_FLAGS; other
    platforms are not affected). Returns the flag set, None when the backend has started or the
    user set a device count already (`make_mesh` then checks that there are enough)."""

    current = os.environ.get("XLA_FLAGS", "")
    if backend_started() or DEVICE_COUNT_FLAG in current:
        return None
    flag = f"{DEVICE_COUNT_FLAG}={n}"
    os.environ["XLA_FLAGS"] = f"{current} {flag}".strip()
    return flag


def make_mesh(shape: tuple[int, ...]) -> Mesh:
    """A mesh of the first prod(shape) devices, axes "data" (and "model"), of type Auto."""
    n, devices = math.prod(shape), jax.devices()
    if len(devices) < n:
        platform = devices[0].platform
        fix = (f": JAX started before zoo.bench could ask for {n}; run it with "
               f"XLA_FLAGS={DEVICE_COUNT_FLAG}={n}" if platform == "cpu" else "")
        raise MeshError(f"--mesh {'x'.join(map(str, shape))} needs {n} devices, the {platform} "
                        f"backend has {len(devices)}{fix}")
    return Mesh(np.array(devices[:n]).reshape(shape), AXES[len(shape)],
                axis_types=(AxisType.Auto,) * len(shape))


def check_batch(mesh: Mesh, batch: int) -> None:
    data = mesh.shape[sharding.DATA]
    if batch % data:
        raise MeshError(f"--mesh: the batch ({batch}) does not split over the {data} devices "
                        f"of the data axis; choose a batch divisible by {data}")


def check_split(strategy: str, arch: str, trees: list[Any]) -> None:
    """Refuse a strategy whose extra mesh axes (tp's "model") split none of the arrays: it
    would time replicated work under its name."""
    strat = sharding.strategy(strategy)
    used = {ax for tree in trees for spec in sharding.specs(tree).values()
            for ax in spec if ax is not None}
    for axis in strat.mesh_axes()[1:]:
        if axis not in used:
            logical = " or ".join(a for a, m in strat.rules if m == axis)
            raise MeshError(f"--strategy {strategy}: no array of {arch} has a {logical} axis "
                            f"that the {axis} axis divides: nothing would be split")


# --------------------------------------------------------------------------- bytes per device
def bytes_by_device(tree: Any) -> dict[int, int]:
    """Device id -> bytes of `tree`'s arrays it holds (their `addressable_shards`)."""
    out: dict[int, int] = defaultdict(int)
    for a in jax.tree.leaves(tree):
        if isinstance(a, jax.Array):
            for shard in a.addressable_shards:
                out[shard.device.id] += math.prod(shard.data.shape) * a.dtype.itemsize
    return dict(out)


def held_bytes(arrays: dict[str, Any]) -> dict[str, Any]:
    """Per group of arrays (parameters, optimizer state, ...) and in total: the bytes on the
    mesh's first device, on the fullest one, and of the whole arrays (one device's share
    without a mesh)."""
    out: dict[str, Any] = {}
    for name, tree in {**arrays, "total": list(arrays.values())}.items():
        per = bytes_by_device(tree)
        first = min(per) if per else None
        out[name] = {"device0": per.get(first, 0), "max": max(per.values(), default=0),
                     "unsharded": sum(a.nbytes for a in jax.tree.leaves(tree)
                                      if isinstance(a, jax.Array))}
    return out


# --------------------------------------------------------------------------- collectives
def _shape_bytes(types: str) -> list[int]:
    return [math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES.get(dt, 4)
            for dt, dims in _SHAPE.findall(types) if dt in _DTYPE_BYTES]


def instructions(hlo: str) -> dict[str, str]:
    """HLO instruction name -> opcode, over every computation of the module's text."""
    out = {}
    for line in hlo.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            out[m.group(1)] = m.group(3)
    return out


def collective_op(opcode: str) -> str | None:
    """The collective an opcode performs ("all-gather-start" -> "all-gather"; the "-done"
    halves of asynchronous pairs are not counted again)."""
    if opcode.endswith("-done"):
        return None
    base = opcode.removesuffix("-start")
    return base if base in COLLECTIVES else None


def hlo_collectives(hlo: str) -> dict[str, Any]:
    """Collective ops of an optimised HLO module: count and result bytes, per op and in all
    (an asynchronous start counts its largest buffer)."""
    ops: dict[str, dict[str, int]] = {}
    for line in hlo.splitlines():
        m = _INSTRUCTION.match(line)
        op = collective_op(m.group(3)) if m else None
        if op is None:
            continue
        sizes = _shape_bytes(m.group(2))
        nbytes = max(sizes, default=0) if m.group(3).endswith("-start") else sum(sizes)
        entry = ops.setdefault(op, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += nbytes
    return {"count": sum(e["count"] for e in ops.values()),
            "bytes": sum(e["bytes"] for e in ops.values()), "ops": ops, "method": HLO_METHOD}


def _op_events(trace_dir: str, names: dict[str, str]) -> tuple[float, float]:
    """(ns in collective ops, ns in all ops) over the events named after an HLO instruction:
    on the device planes where there are any (GPU), else on the host's threads (XLA:CPU)."""
    from jax.profiler import ProfileData

    totals: dict[bool, list[float]] = {True: [0.0, 0.0], False: [0.0, 0.0]}
    for path in glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True):
        for plane in ProfileData.from_file(path).planes:
            device = plane.name.startswith("/device:")
            for line in plane.lines:
                for event in line.events:
                    opcode = names.get(event.name)
                    if opcode is not None:
                        acc = totals[device]
                        acc[1] += event.duration_ns
                        if collective_op(opcode):
                            acc[0] += event.duration_ns
    collective, total = totals[True] if totals[True][1] else totals[False]
    return collective, total


def collective_time(run: Callable[[], Any], steps: int, names: dict[str, str]
                    ) -> dict[str, Any] | None:
    """Profile `steps` calls of `run` (each waited for): the share of HLO op time spent in
    collectives. None when the trace names no op of the program."""
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            for _ in range(steps):
                jax.block_until_ready(run())
        collective, total = _op_events(tmp, names)
    if not total:
        return None
    return {"share": collective / total, "collective_s": collective / 1e9 / steps,
            "ops_s": total / 1e9 / steps, "steps": steps, "method": PROFILE_METHOD}
