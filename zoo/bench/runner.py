"""Run one model benchmark: build, check fairness, time every (mode, impl, call style)."""

from __future__ import annotations

import functools
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import jax
from jax.sharding import Mesh

import zoo
from zoo.bench import accel
from zoo.bench import mesh as mesh_mod
from zoo.bench import styles as styles_mod
from zoo.bench.fairness import check_fairness
from zoo.bench.mesh import MeshError
from zoo.bench.peaks import device_peak
from zoo.bench.records import record_base
from zoo.bench.roofline import model_roofline
from zoo.bench.spec import SubjectConfig, bench_spec
from zoo.bench.subjects import Subject, Task, build_config, build_models, make_task
from zoo.bench.timing import (
    CompileInfo,
    Samples,
    compile_ahead,
    device_peak_memory,
    first_call,
    round_orders,
    round_ratios,
    run_steps,
    settle,
    summarize,
)
from zoo.layers.conv_transpose import CHOICES, choose_method
from zoo.layers.conv_transpose_spec import conv_transposes_of
from zoo.libraries import JAX_IMPLS, interface, library
from zoo.progress import progress as progress_display
from zoo.runtime import precision as policy
from zoo.runtime import sharding

ALL_METHODS: tuple[str, ...] = CHOICES
PROFILE_STEPS = 5  # profiled calls per row on a mesh (the collectives' share of time)
BASELINE_METHOD = "lhs_dilation"


def parse_methods(value: str) -> tuple[str, ...]:
    """`--method` value -> methods: one name, a comma list, or "all" (every formulation + auto)."""
    if value == "all":
        return ALL_METHODS
    methods = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    bad = [m for m in methods if m not in ALL_METHODS]
    if bad or not methods:
        raise ValueError(f"unknown conv-transpose method {bad or value!r}; choose from all, "
                         f"{', '.join(ALL_METHODS)} or a comma list")
    return methods


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
    rounds: int = 5
    settle_s: float = 0.05  # untimed calls of a style before each of its rounds (timing.settle)
    seed: int = 0
    torch_compile: bool = False
    torch_threads: int | None = None
    profile: str | None = None
    precision: str = "default"
    check: str = "strict"  # fairness passes: "strict" (highest, then precision) or "timed"
    steps_per_call: int = 1  # K of the "fused" call style (train: K steps per call)
    xla_cpu_flags: str | None = None  # as given (preset name or string); applied by the CLI
    mesh: tuple[int, ...] | None = None  # (data,) or (data, model) devices: the sharded step
    strategy: str = "fsdp"  # zoo.runtime.sharding.STRATEGIES, with `mesh`
    not_sharded: tuple[str, ...] = ()  # libraries asked for but left out under `mesh`

    @property
    def methods(self) -> tuple[str, ...]:
        """The conv-transpose methods of the run (`method` may be "all" or a comma list)."""
        return parse_methods(self.method)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _twin_flops(subjects: dict[str, Subject], order: list[str], cfg: BenchConfig,
                config: SubjectConfig, task: Task
                ) -> dict[str, tuple[float | None, float | None, str]]:
    """FLOPs and bytes per mode from a JAX implementation's compiled fast path, for PyTorch
    rows; with no JAX implementation in the run, an Equinox twin is compiled (not timed)."""
    twin: dict[str, tuple[float | None, float | None, str]] = {}
    jax_impls = [i for i in order if not subjects[i].is_torch]
    if not jax_impls:
        twin_impl = JAX_IMPLS[0]
        model = build_models(config, (twin_impl,), cfg.seed, cfg.dtype)[twin_impl]
        subjects = {twin_impl: Subject(twin_impl, model, task)}
        jax_impls = [twin_impl]
    for mode in cfg.modes:
        sub = subjects[jax_impls[0]]
        info = sub._cache.get(f"info_{mode}")
        if info is None:
            fwd = sub.fast_forward() if mode == "forward" else sub.fast_train()
            args = (sub.x,) if mode == "forward" else sub.train_args()
            info, _ = compile_ahead(lambda f=fwd, a=args: f.lower(*a))
        if info.flops is not None:
            twin[mode] = (info.flops, info.bytes_accessed,
                          f"{jax_impls[0]} (JAX twin, {info.flops_source})")
    return twin


def _compile(prepared: Any) -> CompileInfo:
    """Compile (ahead of time where the style allows) and make the first call."""
    info = prepared.compile_info
    if info is None:
        info = CompileInfo()
        if prepared.lower is not None:
            try:
                info, _ = compile_ahead(prepared.lower)
            except Exception as e:  # a style without working AOT: its first call compiles
                info = CompileInfo()
                prepared.note = f"no AOT compile ({type(e).__name__})"
        info.first_call_s = first_call(prepared)
    if prepared.step_flop_counts is not None:  # a fused call: FLOPs of one of its steps
        info.flop_counts = dict(prepared.step_flop_counts)
    return info


def _rounds(repeat: int, rounds: int) -> list[int]:
    """`repeat` steps split into at most `rounds` near-equal rounds."""
    rounds = max(1, min(rounds, repeat))
    return [repeat // rounds + (i < repeat % rounds) for i in range(rounds)]


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
    flops, nbytes, source = info.flops, info.bytes_accessed, info.flops_source
    if flops is None and mode in twin_flops:
        flops, nbytes, source = twin_flops[mode]
    # Under a mesh the count is one device's program and the devices may share one chip (host
    # devices): no share of a peak is claimed.
    peak = device_peak() if cfg.mesh is None else None
    res: dict[str, Any] = {
        "impl": impl, "call": call, "mode": mode,
        "default": styles_mod.default_style(impl) == call,
        "idiomatic": styles_mod.idiomatic_style(impl) == call,
        "compile": {"lower_s": info.lower_s, "compile_s": info.compile_s,
                    "first_call_s": info.first_call_s},
        "time": time_stats,
        "dispatch": summarize(samples.dispatch_s),
        "samples_s": [round(v, 9) for v in samples.step_s],
        "round_sizes": samples.rounds,
        "throughput_per_s": cfg.batch / median if median else None,
        "flops": flops, "bytes_accessed": nbytes,
        "flops_source": source if flops is not None else None,
        "memory": {"compiled": info.memory,
                   "device_peak_bytes": measured.get("torch_peak_bytes") or device_peak_memory(),
                   "device_peak_source": ("torch.cuda.max_memory_allocated"
                                          if measured.get("torch_peak_bytes")
                                          else "jax memory_stats (process-wide)")},
    }
    if median and flops:
        res["tflops_per_s"] = flops / median / 1e12
        pf = peak.flops_per_s(policy.compute_format(cfg.dtype, cfg.precision)) if peak else None
        res["peak_flops_share"] = flops / median / pf if pf else None
    if median and nbytes:
        res["gb_per_s"] = nbytes / median / 1e9
        res["peak_bw_share"] = nbytes / median / (peak.gbps * 1e9) if peak else None
    return res


def auto_picks(config: SubjectConfig, batch: int) -> list[str] | None:
    """What `method="auto"` resolves to on this backend: one entry per conv-transpose layer
    (None for a model without any)."""
    specs = conv_transposes_of(config)
    if not specs:
        return None
    return [choose_method((batch, sp.in_channels, *sp.input_size),
                          (sp.in_channels, sp.out_channels, *sp.per_dim[0]), sp.per_dim[1],
                          sp.per_dim[4], jax.default_backend())
            for sp in specs]


def _per_round(row: dict[str, Any]) -> list[list[float]]:
    samples = Samples(step_s=row["samples_s"], rounds=row.get("round_sizes") or [])
    return samples.per_round()


def _add_ratios(results: list[dict[str, Any]], modes: tuple[str, ...],
                rooflines: dict[str, dict[str, Any]]) -> None:
    """× fastest, × lhs_dilation (same impl, call, mode), × torch (the faster PyTorch style),
    × roofline (median / roofline time); `ratio_to_fastest_rounds`: × fastest paired round by
    round (`timing.round_ratios`), with its spread."""
    for mode in modes:
        rows = [r for r in results if r["mode"] == mode and r["time"].get("median_s")]
        best = min((r["time"]["median_s"] for r in rows), default=None)
        if rows and len({tuple(r.get("round_sizes") or ()) for r in rows}) == 1 \
                and rows[0].get("round_sizes"):
            fastest = min(range(len(rows)), key=lambda i: rows[i]["time"]["median_s"])
            paired = round_ratios({i: _per_round(r) for i, r in enumerate(rows)}, fastest)
            for i, r in enumerate(rows):
                r["ratio_to_fastest_rounds"] = paired[i]
        base = {(r["impl"], r["call"]): r["time"]["median_s"] for r in rows
                if r.get("method") == BASELINE_METHOD}
        torch_best = min((r["time"]["median_s"] for r in rows
                          if library(r["impl"]).reference), default=None)
        roof = rooflines.get(mode, {}).get("time_s")
        for r in rows:
            med = r["time"]["median_s"]
            r["ratio_to_fastest"] = med / best
            if r.get("method") and (r["impl"], r["call"]) in base:
                r["ratio_to_lhs_dilation"] = med / base[(r["impl"], r["call"])]
            if torch_best and not library(r["impl"]).reference:
                r["ratio_to_torch"] = med / torch_best
            if roof:
                r["ratio_to_roofline"] = med / roof


def _flops_floors(config: SubjectConfig, cfg: BenchConfig, rooflines: dict[str, dict[str, Any]]
                  ) -> dict[str, float]:
    """Per mode, the useful FLOPs every compiled count must reach: the roofline's, else the
    matrix products the subject declares (`BenchSpec.useful_flops`)."""
    floors = {m: r["flops"] for m, r in rooflines.items()}
    spec = bench_spec(cfg.arch)
    for mode in cfg.modes:
        useful = spec.flops_floor(config, cfg.batch, mode)
        if mode not in floors and useful:
            floors[mode] = useful
    return floors


def run(cfg: BenchConfig, *, console: Any = None, progress: bool = True) -> dict[str, Any]:
    """Build the models, refuse unfair comparisons (`FairnessError`), time, return the record.

    With several conv-transpose methods (`method="all"` or a comma list), every JAX
    implementation is built once per method (subjects named "impl:method"), PyTorch once, and
    all of them are checked and timed together in one interleaved run.
    """
    if cfg.torch_threads:
        for impl in cfg.impls:
            library(impl).set_threads(cfg.torch_threads)
    with policy.use(cfg.precision):
        return _run(cfg, console, progress, mesh_mod.make_mesh(cfg.mesh) if cfg.mesh else None)


def _place(natives: dict[str, Any], config: SubjectConfig, cfg: BenchConfig,
           mesh: Mesh) -> dict[str, Any]:
    """The models with their arrays on `mesh` as `cfg.strategy` splits them (`MeshError` for a
    mesh or strategy the run cannot use)."""
    if not isinstance(config, zoo.Config):
        raise MeshError(f"--mesh: {cfg.arch} is a bench-only subject; only zoo architectures "
                        "are sharded")
    mesh_mod.check_batch(mesh, cfg.batch)
    try:
        sharding.strategy(cfg.strategy).check(mesh)
    except ValueError as e:
        raise MeshError(f"--strategy {cfg.strategy}: {e}") from None
    placed = {i: sharding.shard(m, i, mesh, cfg.strategy, config=config)
              for i, m in natives.items()}
    mesh_mod.check_split(cfg.strategy, cfg.arch, [interface(i).split(m)[1:]
                                                  for i, m in placed.items()])
    return placed


def _mesh_row(subject: Subject, prepared: Any, info: CompileInfo, mode: str,
              steps: int) -> dict[str, Any]:
    """What a row on a mesh records: bytes per device from the shardings, the collectives of
    the compiled program and their share of the op time in a profile of `steps` calls."""
    share = None
    if info.hlo_ops:
        share = mesh_mod.collective_time(lambda: prepared.fn(*prepared.args), steps,
                                         info.hlo_ops)
    return {"bytes": mesh_mod.held_bytes(subject.held_arrays(mode)),
            "collectives": info.collectives, "collective_time": share}


def _mesh_record(cfg: BenchConfig, mesh: Mesh) -> dict[str, Any]:
    devices = mesh.devices.flatten()
    return {"shape": list(cfg.mesh), "axes": list(mesh.axis_names), "strategy": cfg.strategy,
            "devices": len(devices), "platform": devices[0].platform,
            "device_kind": devices[0].device_kind, "not_sharded": list(cfg.not_sharded),
            "collective_methods": [mesh_mod.HLO_METHOD, mesh_mod.PROFILE_METHOD]}


def _run(cfg: BenchConfig, console: Any, progress: bool, mesh: Mesh | None) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    clock = time.perf_counter
    phases = {"start": clock()}
    methods = cfg.methods
    multi = len(methods) > 1
    configs = {m: build_config(cfg.arch, cfg.model_config, m) for m in methods}
    config = configs[methods[0]]
    task = make_task(config, cfg.batch, cfg.dtype, cfg.seed)
    subjects: dict[str, Subject] = {}
    method_of: dict[str, str | None] = {}
    jax_impls = tuple(i for i in cfg.impls if library(i).is_jax)
    for m in methods:
        natives = build_models(configs[m], jax_impls, cfg.seed, cfg.dtype)
        if mesh is not None:
            natives = _place(natives, configs[m], cfg, mesh)
        for impl in jax_impls:
            name = f"{impl}:{m}" if multi else impl
            subjects[name] = Subject(impl, natives[impl], task, name=name,
                                     steps_per_call=cfg.steps_per_call, mesh=mesh)
            method_of[name] = m
    for impl in (i for i in cfg.impls if not library(i).is_jax):
        subjects[impl] = Subject(impl, build_models(config, (impl,), cfg.seed, cfg.dtype)[impl],
                                 task)
        method_of[impl] = None if multi else methods[0]
    phases["build"] = clock()
    # JAX implementations first: the reference output and FLOP count come from a compiled program.
    order = sorted(subjects, key=lambda n: subjects[n].is_torch)
    peak = device_peak()
    rooflines: dict[str, dict[str, Any]] = {}
    for mode in cfg.modes:
        roof = model_roofline(config, cfg.batch, cfg.dtype, mode)
        if roof is not None:
            rooflines[mode] = {**roof.to_dict(), "time_s": roof.time_s(
                peak.flops_per_s(policy.compute_format(cfg.dtype, cfg.precision)) if peak else None,
                peak.gbps * 1e9 if peak else None)}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    bar = (progress_display(console or Console(), *columns) if progress
           else Progress(disable=True))
    # Per mode: compile and warm up every (subject, call style), then time them in interleaved
    # rounds, so that drifts of the machine (other processes, clocks) hit all styles alike.
    results: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    with bar:
        check = bar.add_task("checking outputs and FLOP counts", total=None)
        fairness = check_fairness(
            {n: subjects[n] for n in order}, cfg.modes, dtype=cfg.dtype, precision=cfg.precision,
            strict=cfg.check == "strict",
            flops_groups={n: m for n, m in method_of.items() if m} if multi else None,
            flops_floor=_flops_floors(config, cfg, rooflines))
        bar.remove_task(check)
        phases["fairness"] = clock()
        twin = _twin_flops(subjects, order, cfg, config, task)
        for mode in cfg.modes:
            runs = [(name, call) for name in order for call in cfg.calls[subjects[name].impl]]
            prepared, infos, samples, torch_peaks = {}, {}, {}, {}
            setup = bar.add_task(f"{mode}: compile + warm-up", total=len(runs))
            for key in list(runs):
                impl = subjects[key[0]].impl
                try:
                    accel.torch_reset_peak()
                    prepared[key] = styles_mod.styles(impl)[key[1]](subjects[key[0]], mode)
                    infos[key] = _compile(prepared[key])
                    run_steps(prepared[key], cfg.warmup)
                    if subjects[key[0]].is_torch:
                        torch_peaks[key] = accel.torch_peak_bytes()
                except Exception as e:
                    # A library's default style must work; an optional one may not exist in the
                    # installed version (APIs of nnx partials, torch.compile backends): record it.
                    if styles_mod.default_style(impl) == key[1]:
                        raise
                    runs.remove(key)
                    prepared.pop(key, None)
                    failed.append({"impl": impl, "call": key[1], "mode": mode,
                                   "method": method_of[key[0]],
                                   "error": f"{type(e).__name__}: {e}"[:500]})
                    continue
                samples[key] = Samples()
                bar.advance(setup)
            bar.remove_task(setup)
            timed = bar.add_task(f"{mode}: timing {len(runs)} styles",
                                 total=cfg.repeat * len(runs))
            advance = functools.partial(bar.advance, timed)
            sizes = _rounds(cfg.repeat, cfg.rounds)
            for n, keys in zip(sizes, round_orders(runs, len(sizes), cfg.seed), strict=True):
                for key in keys:
                    settle(prepared[key], cfg.settle_s)
                    run_steps(prepared[key], n, samples[key], advance)
                    samples[key].rounds.append(n)
            bar.remove_task(timed)
            for key in runs:
                name, call = key
                impl = subjects[name].impl
                if cfg.profile and not subjects[name].is_torch:
                    _profile(prepared[key], os.path.join(
                        cfg.profile, f"{cfg.arch}-{mode}-{name.replace(':', '-')}-{call}"),
                        min(cfg.repeat, 10))
                res = _result(impl, call, mode, {"compile": infos[key], "samples": samples[key],
                                                 "torch_peak_bytes": torch_peaks.get(key)},
                              cfg, twin)
                res["method"] = method_of[name]
                res["steps_per_call"] = prepared[key].steps
                if mesh is not None:
                    res["mesh"] = _mesh_row(subjects[name], prepared[key], infos[key], mode,
                                            min(cfg.repeat, PROFILE_STEPS))
                if prepared[key].note:
                    res["note"] = prepared[key].note
                results.append(res)
            del prepared

    _add_ratios(results, cfg.modes, rooflines)
    phases["timing"] = clock()
    record = record_base("model")
    record["phases_s"] = {k: phases[k] - phases[p] for p, k in
                          (("start", "build"), ("build", "fairness"), ("fairness", "timing"))}
    record["config"] = {**cfg.to_dict(), "resolved_config": config.to_dict(),
                        "input_shape": list(task.x.shape), "loss": task.loss}
    record["config"]["methods"] = list(methods)
    record["config"]["auto_picks"] = auto_picks(config, cfg.batch)
    record["roofline"] = rooflines
    record["fairness"] = fairness
    record["results"] = results
    record["failed_styles"] = failed
    record["skipped_styles"] = styles_mod.skipped_styles(cfg.impls)
    if mesh is not None:
        record["mesh"] = _mesh_record(cfg, mesh)
    return record
