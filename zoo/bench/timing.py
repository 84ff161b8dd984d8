"""Timing primitives: ahead-of-time compile measurements, cost analysis, the step loop."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import jax
import numpy as np

from zoo.bench import flops as flops_mod
from zoo.bench import mesh
from zoo.bench.flops import jax_compiled


@dataclass
class Prepared:
    """One ready-to-time call: `fn(*args)` runs one step; `block(out)` waits for its result.

    `lower` (if the style supports ahead-of-time compilation) returns a `Lowered` of exactly the
    program a call runs. `compile_info`, when already known (the fast path after the fairness
    check), is reused instead of compiling again. `steps`: training steps (or batches) per
    call; recorded times are per step (call time / steps). `step_flop_counts`: FLOP counts of one
    step, for a fused call whose loop cost analysis would not give them per step.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    block: Callable[[Any], Any] = jax.block_until_ready
    lower: Callable[[], Any] | None = None
    compile_info: CompileInfo | None = None
    note: str = ""
    steps: int = 1
    step_flop_counts: dict[str, tuple[float, float | None]] | None = None


@dataclass
class CompileInfo:
    """Seconds to lower (trace + StableHLO) and to compile (XLA), the program's FLOP counts per
    source (`zoo.bench.flops`: source -> (flops, bytes accessed)) and its memory footprint; for
    a program on several devices, its collectives (`zoo.bench.mesh.hlo_collectives`) and its
    HLO instruction names -> opcodes (to find its ops in a profile)."""

    lower_s: float | None = None
    compile_s: float | None = None
    first_call_s: float | None = None
    flop_counts: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    memory: dict[str, int] | None = None
    collectives: dict[str, Any] | None = None
    hlo_ops: dict[str, str] | None = field(default=None, repr=False)

    @property
    def flops_source(self) -> str | None:
        return flops_mod.best(self.flop_counts)[0]

    @property
    def flops(self) -> float | None:
        value = flops_mod.best(self.flop_counts)[1]
        return value[0] if value else None

    @property
    def bytes_accessed(self) -> float | None:
        value = flops_mod.best(self.flop_counts)[1]
        return value[1] if value else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hlo_ops": None, "flops": self.flops,
                "flops_source": self.flops_source}


_MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                  "temp_size_in_bytes", "generated_code_size_in_bytes")


def memory_analysis(compiled: Any) -> dict[str, int] | None:
    """Argument, output, alias and temporary bytes of a compiled executable; `total_bytes` is
    arguments + outputs + temporaries - aliased (donated) bytes: its footprint while running."""
    compiled = jax_compiled(compiled)
    try:
        ma = compiled.memory_analysis() if compiled is not None else None
    except Exception:
        return None
    if ma is None:
        return None
    out = {f.removesuffix("_size_in_bytes"): int(getattr(ma, f, 0) or 0) for f in _MEMORY_FIELDS}
    out["total_bytes"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def compile_ahead(lower: Callable[[], Any]) -> tuple[CompileInfo, Any]:
    """Lower, then compile, timing each; returns the info and the compiled executable."""
    t0 = time.perf_counter()
    lowered = lower()
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    counts = flops_mod.count(lowered, compiled)
    info = CompileInfo(t1 - t0, t2 - t1, None, counts, memory_analysis(compiled))
    if flops_mod.program_devices(compiled) > 1:
        hlo = compiled.as_text()
        info.collectives, info.hlo_ops = mesh.hlo_collectives(hlo), mesh.instructions(hlo)
    return info, compiled


def first_call(prepared: Prepared) -> float:
    t0 = time.perf_counter()
    prepared.block(prepared.fn(*prepared.args))
    return time.perf_counter() - t0


@dataclass
class Samples:
    """Per-step wall times (call + wait) and host times (until the call returned); `rounds`:
    how many of `step_s` each timed round added, in order."""

    step_s: list[float] = field(default_factory=list)
    dispatch_s: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)

    def per_round(self) -> list[list[float]]:
        """`step_s` split into its rounds."""
        out, i = [], 0
        for n in self.rounds:
            out.append(self.step_s[i:i + n])
            i += n
        return out


def run_steps(prepared: Prepared, n: int, samples: Samples | None = None,
              on_step: Callable[[], Any] | None = None) -> Samples:
    """`n` timed calls, each waited for (`block`) before the next starts; times per step."""
    samples = samples if samples is not None else Samples()
    fn, args, block, per = prepared.fn, prepared.args, prepared.block, prepared.steps
    clock = time.perf_counter
    for _ in range(n):
        t0 = clock()
        out = fn(*args)
        t1 = clock()
        block(out)
        t2 = clock()
        samples.step_s.append((t2 - t0) / per)
        samples.dispatch_s.append((t1 - t0) / per)
        if on_step is not None:
            on_step()
    return samples


def settle(prepared: Prepared, seconds: float) -> int:
    """Untimed calls of `prepared` until `seconds` have passed (at least one); returns how many.

    Run before each timed round: a subject timed right after another runs while the other's
    threads still spin (PyTorch's OpenMP threads spin for about 15 ms after a parallel region,
    measured: the next JAX program's first calls take 1.6-1.8x as long on two cores) and with
    caches holding the other's arrays. Settling times every subject in its steady state.
    """
    fn, args, block, clock = prepared.fn, prepared.args, prepared.block, time.perf_counter
    start, calls = clock(), 0
    while True:
        block(fn(*args))
        calls += 1
        if clock() - start >= seconds:
            return calls


def round_orders(keys: list[Any], rounds: int, seed: int) -> list[list[Any]]:
    """One seeded random order of `keys` per round: unlike a rotation, which keeps every key
    after the same neighbour, each key follows each other key about equally often."""
    rng = np.random.default_rng(seed)
    return [[keys[i] for i in rng.permutation(len(keys))] for _ in range(rounds)]


def round_ratios(rounds: dict[Any, list[list[float]]], reference: Any) -> dict[Any, dict]:
    """Paired ratios: per round, each key's median step time over `reference`'s in the same
    round; their median, p10 and p90 over the rounds (a drift of the machine during the run
    moves both sides of each ratio alike)."""
    ref = np.array([np.median(r) for r in rounds[reference]])
    out = {}
    for key, per_round in rounds.items():
        ratios = np.array([np.median(r) for r in per_round]) / ref
        out[key] = {"median": float(np.median(ratios)), "p10": float(np.percentile(ratios, 10)),
                    "p90": float(np.percentile(ratios, 90)), "rounds": len(ratios)}
    return out


def summarize(values: list[float]) -> dict[str, float | int]:
    """median, p10, p90, min, mean (seconds) and the sample count."""
    if not values:
        return {"n": 0}
    a = np.asarray(values)
    return {"median_s": float(np.median(a)), "p10_s": float(np.percentile(a, 10)),
            "p90_s": float(np.percentile(a, 90)), "min_s": float(a.min()),
            "mean_s": float(statistics.fmean(values)), "n": len(values)}


def device_peak_memory() -> int | None:
    """Peak bytes in use on the default JAX device, where the backend reports it (GPU/TPU)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:
        return None
    if not stats:
        return None
    peak = stats.get("peak_bytes_in_use")
    return int(peak) if peak is not None else None
