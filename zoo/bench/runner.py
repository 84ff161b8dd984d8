"""Run one model benchmark: build, check fairness, time every (mode, impl, call style)."""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import jax

from zoo.bench import styles as styles_mod
from zoo.bench.fairness import check_fairness
from zoo.bench.peaks import device_info, device_peak, versions
from zoo.bench.subjects import Subject, build_config, build_models, make_task
from zoo.bench.timing import (
    CompileInfo,
    Samples,
    compile_ahead,
    device_peak_memory,
    first_call,
    run_steps,
    summarize,
)

SCHEMA = 1


@dataclass
class BenchConfig:
    """Everything that defines a run (stored in full in its JSON record)."""

    arch: str
    impls: tuple[str, ...]
    calls: dict[str, list[str]]  # impl -> call styles
    modes: tuple[str, ...] = ("forward",)
    batch: int = 1
    dtype: str = "float32"
    model_config: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None
    method: str = "auto"
    warmup: int = 3
    repeat: int = 20
    seed: int = 0
    torch_compile: bool = False
    profile: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _record_base(kind: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "kind": kind,
            "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device": device_info(), "versions": versions()}


def _measure(prepared: Any, cfg: BenchConfig, on_step: Any = None) -> dict[str, Any]:
    """Compile (ahead of time where the style allows), first call, warm-up, timed steps."""
    info = prepared.compile_info
    if info is None:
        info = CompileInfo()
        if prepared.lower is not None:
            try:
                info, _ = compile_ahead(prepared.lower)
            except Exception as e:  # a style without working AOT: first call compiles
                info = CompileInfo()
                prepared.note = f"no AOT compile ({type(e).__name__})"
        info.first_call_s = first_call(prepared)
    run_steps(prepared, cfg.warmup, Samples(), on_step)
    samples = run_steps(prepared, cfg.repeat, Samples(), on_step)
    return {"compile": info, "samples": samples}


def _profile(prepared: Any, directory: str, n: int) -> None:
    os.makedirs(directory, exist_ok=True)
    with jax.profiler.trace(directory):
        run_steps(prepared, n)


def _result(impl: str, call: str, mode: str, measured: dict[str, Any], cfg: BenchConfig,
            twin_flops: dict[str, tuple[float | None, float | None, str]]) -> dict[str, Any]:
    info: CompileInfo = measured["compile"]
    samples: Samples = measured["samples"]
    time_stats = summarize(samples.step_s)
    median = time_stats.get("median_s")
    flops, nbytes, source = info.flops, info.bytes_accessed, "compiled"
    if flops is None and mode in twin_flops:
        flops, nbytes, source = twin_flops[mode]
    peak = device_peak()
    res: dict[str, Any] = {
        "impl": impl, "call": call, "mode": mode,
        "default": styles_mod.DEFAULT_STYLE.get(impl) == call,
        "idiomatic": styles_mod.IDIOMATIC_STYLE.get(impl) == call,
        "compile": {"lower_s": info.lower_s, "compile_s": info.compile_s,
                    "first_call_s": info.first_call_s},
        "time": time_stats,
        "dispatch": summarize(samples.dispatch_s),
        "throughput_per_s": cfg.batch / median if median else None,
        "flops": flops, "bytes_accessed": nbytes,
        "flops_source": source if flops is not None else None,
        "memory": {"compiled": info.memory, "device_peak_bytes": device_peak_memory()},
    }
    if median and flops:
        res["tflops_per_s"] = flops / median / 1e12
        pf = peak.flops_per_s(cfg.dtype) if peak else None
        res["peak_flops_share"] = flops / median / pf if pf else None
    if median and nbytes:
        res["gb_per_s"] = nbytes / median / 1e9
        res["peak_bw_share"] = nbytes / median / (peak.gbps * 1e9) if peak else None
    return res


def run(cfg: BenchConfig, *, console: Any = None, progress: bool = True) -> dict[str, Any]:
    """Build the models, refuse unfair comparisons (`FairnessError`), time, return the record."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn

    config = build_config(cfg.arch, cfg.model_config, cfg.method)
    task = make_task(config, cfg.batch, cfg.dtype, cfg.seed)
    natives = build_models(config, cfg.impls, cfg.seed, cfg.dtype)
    subjects = {impl: Subject(impl, natives[impl], task) for impl in cfg.impls}
    # JAX implementations first: the reference output and FLOP count come from a compiled program.
    order = sorted(subjects, key=lambda n: subjects[n].is_torch)
    fairness = check_fairness({n: subjects[n] for n in order}, cfg.modes, dtype=cfg.dtype)

    twin: dict[str, tuple[float | None, float | None, str]] = {}
    for mode in cfg.modes:
        for impl in order:
            info = subjects[impl]._cache.get(f"info_{mode}")
            if info is not None and info.flops is not None:
                twin[mode] = (info.flops, info.bytes_accessed, f"{impl} (JAX twin)")
                break

    runs = [(mode, impl, call) for mode in cfg.modes for impl in order
            for call in cfg.calls[impl]]
    results: list[dict[str, Any]] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    bar = Progress(*columns, console=console, transient=True, disable=not progress)
    with bar if progress else contextlib.nullcontext():
        overall = bar.add_task("benchmark", total=len(runs))
        for mode, impl, call in runs:
            task_id = bar.add_task(f"{mode:7} {impl:5} {call}", total=cfg.warmup + cfg.repeat)
            prepared = styles_mod.STYLES[impl][call](subjects[impl], mode)
            measured = _measure(prepared, cfg, lambda t=task_id: bar.advance(t))
            if cfg.profile and not subjects[impl].is_torch:
                _profile(prepared, os.path.join(cfg.profile, f"{cfg.arch}-{mode}-{impl}-{call}"),
                         min(cfg.repeat, 10))
            res = _result(impl, call, mode, measured, cfg, twin)
            if prepared.note:
                res["note"] = prepared.note
            results.append(res)
            bar.remove_task(task_id)
            bar.advance(overall)

    for mode in cfg.modes:
        rows = [r for r in results if r["mode"] == mode and r["time"].get("median_s")]
        best = min((r["time"]["median_s"] for r in rows), default=None)
        for r in rows:
            r["ratio_to_fastest"] = r["time"]["median_s"] / best
    record = _record_base("model")
    record["config"] = {**cfg.to_dict(), "resolved_config": config.to_dict(),
                        "input_shape": list(task.x.shape), "loss": task.loss}
    record["fairness"] = fairness
    record["results"] = results
    return record
