"""`python -m zoo.bench gpu [--dry-run]`: everything the zoo measures on a GPU, in one run.

The run is a list of parts (`PARTS`: data), each with a share of the time budget (`--budget-min`,
8 by default): the environment, the GPU part of the test suite (time-capped), the seeds'
questions (the 3-D conv-transpose at (4, 4, 256^3), the CNN in NNX against Linen, the dispatch
suite with its 10,000 static leaves), the model presets at realistic sizes in TF32, full float32
and bfloat16 against PyTorch, and the report. Part i ends by start + budget x (the shares of
parts 0..i): a part that ends early leaves its time to the next. The benchmark commands are the
budgeted entries of `zoo.bench.matrix` (one mechanism with `python -m zoo.bench matrix`): an
entry runs only if its estimate ends within its part (torch.compile only with time to spare;
else the entry runs without it), otherwise it is skipped and the command that runs it alone is
printed. They run in one worker process that is stopped at the end of the last benchmark part
whatever happens (a hang cannot eat the report's time); a crashed worker is restarted after the
entry that crashed. Records (JSON: device, driver, library versions, precision), the run's log,
a README and plots go to `--out/<device>/`, and are copied to `$OUT/<device>/` after every part
when `$OUT` is set (what is done survives a run cut short).

`--dry-run` runs every part's code path with tiny shapes (CPU, under 2 minutes): the command is
known to work before GPU time is spent.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.bench.matrix import (
    Entry,
    Slot,
    fmt_left,
    measured_times,
    print_skipped,
    run_entry,
    run_slots,
)
from zoo.cli import ArgumentParser
from zoo.layers.conv_transpose import METHODS

BUDGET_MIN = 8.0
COMMAND = "python -m zoo.bench gpu"
TIME_CAP = "time cap reached"  # tests/conftest.py's skip reason
TIMING = ("--repeat", "20", "--warmup", "3", "--rounds", "5", "--settle", "50", "--no-progress")
DRY_TIMING = ("--repeat", "1", "--warmup", "0", "--rounds", "1", "--settle", "0",
              "--no-progress")
# Seconds the test part leaves between its cap and its hard end (the running tests finish,
# the workers stop, the JUnit file is written).
TESTS_GRACE_S = 15.0


@dataclass(frozen=True)
class Bench:
    """`python -m zoo.bench ARCH [--preset PRESET] ARGS`; the dry run takes the `tiny` preset and
    `dry_args` (None: `args`). `torch_compile`: adds PyTorch's torch.compile style when there is
    time to spare (else the entry runs without it). `compile_s`: seconds per JAX compilation at
    this size, for the estimate (None: `zoo.bench.matrix.COMPILE_S`)."""

    arch: str
    preset: str | None = None
    args: tuple[str, ...] = ()
    dry_args: tuple[str, ...] | None = None
    torch_compile: bool = False
    compile_s: float | None = None

    def entry(self, group: str, dry: bool) -> Entry:
        preset = ("--preset", "tiny") if dry else (
            ("--preset", self.preset) if self.preset else ())
        args = self.dry_args if dry and self.dry_args is not None else self.args
        argv = (self.arch, *preset, *args, *(DRY_TIMING if dry else TIMING))
        if self.torch_compile and not dry:  # the dry run leaves Inductor out (CPU time)
            return Entry(group, (*argv, "--torch-compile"), fallback=argv,
                         compile_s=self.compile_s)
        return Entry(group, argv, compile_s=self.compile_s)


@dataclass(frozen=True)
class Dispatch:
    """`python -m zoo.bench dispatch ARGS` (the dry run: `dry_args`)."""

    args: tuple[str, ...]
    dry_args: tuple[str, ...]

    def entry(self, group: str, dry: bool) -> Entry:
        return Entry(group, ("dispatch", *(self.dry_args if dry else self.args), "--no-progress"))


@dataclass(frozen=True)
class Part:
    """One part of the GPU run: `share` of the budget (shares are relative: they are divided by
    their sum), what it is (`doc`), its `kind` (env, tests, bench or report), the modules it
    needs (`needs`; a part whose module is missing is skipped) and, for a bench part, its
    commands (`runs`), for the tests part its test files (`tests`; the dry run: `dry_tests`)."""

    name: str
    share: float
    doc: str
    kind: str = "bench"
    runs: tuple[Bench | Dispatch, ...] = ()
    tests: tuple[str, ...] = ()
    dry_tests: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()

    def entries(self, dry: bool) -> list[Entry]:
        return [run.entry(self.name, dry) for run in self.runs]


CORE = ("jax", "flax", "equinox", "optax", "orbax.checkpoint", "safetensors", "numpy", "rich")
BENCH_NEEDS = (*CORE, "torch")
# Equivalence, converter and layer tests: every library's device code against PyTorch, most
# wanted first (the cap cuts the last ones).
GPU_TESTS = tuple(f"tests/test_{name}.py" for name in (
    "equivalence", "torch_reference", "fast", "precision", "conv_transpose_methods",
    "conv_layer", "layer_norm", "activations", "pooling", "eqx_layers", "converters",
    "optimizer_conversion", "interface_models", "layer_rules", "layer_rules_pool_norm",
    "attention_rules", "resnet", "vit", "unet3d", "intermediates", "model_api"))
DRY_TESTS = ("tests/test_activations.py",)  # values and gradients against PyTorch
# The seed's conv-transpose: every formulation by name ("auto" is one of them on a GPU); the dry
# run two of them (a method comparison all the same).
CONVT_METHODS = ("--method", ",".join(METHODS))
DRY_METHODS = ("--method", "lhs_dilation,im2col")
# The realistic sizes: (subject, preset, seconds per JAX compilation on an H100 host: guesses
# until measured) for ResNet-50, ViT-B/16 and the 3-D U-Net.
MODEL_PRESETS: tuple[tuple[str, str, float], ...] = (
    ("resnet", "resnet50-224", 8.0), ("vit", "vit-b16", 5.0), ("unet3d", "unet3d-128", 8.0))
# float32 at the libraries' default precision (TF32 on the GPU) first, then bfloat16, then full
# float32.
PRECISIONS: tuple[tuple[str, ...], ...] = ((), ("--dtype", "bfloat16"),
                                           ("--precision", "highest"))


def preset_runs(presets: tuple[tuple[str, str, float], ...]) -> tuple[Bench, ...]:
    """Each (subject, preset, compile seconds) in every precision, every library against
    PyTorch eager (torch.compile with time to spare), in the preset's modes. The dry run times
    the forward pass of Equinox and PyTorch (as `matrix --quick` does: every library on the
    tiny presets is the test suite's job; the training step's code path is the conv-transpose
    entries', every library's the conv-transpose and CNN entries')."""
    runs = []
    for precision in PRECISIONS:
        for arch, preset, compile_s in presets:
            args = ("--call", "default", *precision)
            runs.append(Bench(arch, preset, ("--impl", "all", *args),
                              ("--mode", "forward", "--impl", "eqx,torch", *args),
                              torch_compile=True, compile_s=compile_s))
    return tuple(runs)


# The run, most wanted first. Another family of presets (the language models' prefill and
# decode) joins as one more part: Part("lm", SHARE, DOC, runs=preset_runs((("ARCH",
# "PRESET", COMPILE_S), ...)), needs=BENCH_NEEDS).
PARTS: tuple[Part, ...] = (
    Part("env", 0.02, "the working tree, the packages every part needs, the GPU", kind="env"),
    Part("tests", 0.15, "the GPU part of the test suite (cpu_only left out), time-capped",
         kind="tests", tests=GPU_TESTS, dry_tests=DRY_TESTS,
         needs=(*BENCH_NEEDS, "pytest", "hypothesis", "chex", "torchvision", "timm",
                "transformers")),
    Part("convt", 0.30, "seed: the 3-D conv-transpose at (4, 4, 256^3), every method, the "
         "three libraries and PyTorch, forward and training; the bf16 weight gradient",
         runs=(Bench("convt", "convt-256", ("--mode", "forward", "--impl", "all",
                                            *CONVT_METHODS), ("--mode", "forward", *DRY_METHODS),
                     torch_compile=True),
               Bench("convt", "convt-256", ("--mode", "train", "--impl", "all", *CONVT_METHODS),
                     ("--mode", "train", *DRY_METHODS), torch_compile=True),
               Bench("convt", "convt-wgrad", ("--mode", "train", "--dtype", "bfloat16",
                                              "--impl", "all", *CONVT_METHODS),
                     ("--mode", "train", "--dtype", "bfloat16", *DRY_METHODS))),
         needs=BENCH_NEEDS),
    Part("cnn", 0.06, "seed: the CNN in NNX against Linen, fastest and idiomatic call styles",
         runs=(Bench("cnn", None, ("--mode", "both", "--impl", "linen,nnx", "--call",
                                   "default,idiomatic"),
                     ("--mode", "forward", "--impl", "linen,nnx", "--call",
                      "default,idiomatic")),),
         needs=BENCH_NEEDS),
    Part("dispatch", 0.08, "seed: the dispatch suite (identity, MLP, MLP training step, and "
         "the 10,000 static leaves a call flattens)",
         runs=(Dispatch(("--impl", "all", "--rounds", "20", "--budget", "0.005"),
                        ("--impl", "eqx,torch", "--workload", "static10k,mlp_train",
                         "--rounds", "1", "--budget", "0.0005", "--tiny")),),
         needs=BENCH_NEEDS),
    Part("presets", 0.33, "ResNet-50 at 224, ViT-B/16, the 3-D U-Net at 128^3: TF32 (the "
         "default), bfloat16 and full float32, every library against PyTorch eager (and "
         "torch.compile with time to spare)", runs=preset_runs(MODEL_PRESETS),
         needs=BENCH_NEEDS),
    Part("report", 0.06, "the README and plots of the records; the copy to $OUT", kind="report",
         needs=("matplotlib",)),
)


# --------------------------------------------------------------------------- the budget
def part_windows(parts: tuple[Part, ...], start: float, budget_s: float
                 ) -> dict[str, tuple[float, float]]:
    """Part name -> (start, end) of its share: part i ends by start + budget x (the shares of
    parts 0..i) / (the sum of all shares)."""
    total = sum(p.share for p in parts)
    out, at = {}, start
    for p in parts:
        end = at + budget_s * p.share / total
        out[p.name] = (at, end)
        at = end
    return out


def bench_slots(parts: tuple[Part, ...], dry: bool, start: float, budget_s: float,
                exclude: frozenset[str] = frozenset()) -> list[Slot]:
    """The benchmark entries of the bench parts (but those in `exclude`), each with its part's
    end as deadline (the windows of every part in `parts`)."""
    windows = part_windows(parts, start, budget_s)
    return [Slot(entry, p.name, windows[p.name][1]) for p in parts
            if p.kind == "bench" and p.name not in exclude for entry in p.entries(dry)]


def select(only: str | None) -> tuple[Part, ...]:
    """`--only` (a comma list of part names) -> the parts, in their order."""
    if not only:
        return PARTS
    names = {n.strip() for n in only.split(",") if n.strip()}
    unknown = sorted(names - {p.name for p in PARTS})
    if unknown:
        raise ValueError(f"--only: unknown part(s) {unknown}; parts: "
                         + ", ".join(p.name for p in PARTS))
    return tuple(p for p in PARTS if p.name in names)


# --------------------------------------------------------------------------- the test part
def pytest_command(part: Part, dry: bool, cap_s: float | None, junit: str | None,
                   workers: int | None) -> list[str]:
    """The test part's command: its files, `cpu_only` tests left out (deselected), the time cap
    (tests/conftest.py: tests not started within `cap_s` are skipped; None: no cap), a JUnit
    file for the record, `workers` xdist processes (None: no xdist), failures and errors
    listed."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
            "-m", "not cpu_only", "--continue-on-collection-errors"]
    if cap_s is not None:
        argv += ["--time-cap", f"{max(0.0, cap_s):.0f}"]
    if junit is not None:
        argv.append(f"--junitxml={junit}")
    if workers is not None:
        argv += ["-n", str(workers)]
    return argv + list(part.dry_tests if dry else part.tests)


def xdist_workers(dry: bool) -> int | None:
    """xdist processes for the test part: half the cores, at most 8 (each holds a JAX and a
    PyTorch context on the GPU); None (one process) in the dry run or without pytest-xdist."""
    if dry or importlib.util.find_spec("xdist") is None:
        return None
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def shown(argv: list[str]) -> str:
    """A child's command line as the user would type it."""
    return shlex.join(["python", *argv[1:]])


def junit_summary(path: str) -> dict[str, Any]:
    """Counts of a pytest JUnit file: passed, failed, errors, skipped, cut (skipped by the time
    cap), with the failed tests' ids and first message lines."""
    root = ET.parse(path).getroot()
    counts = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "cut": 0}
    failures = []
    for case in root.iter("testcase"):
        counts["tests"] += 1
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            key = "failed" if "failure" in kinds else "errors"
            counts[key] += 1
            message = (kinds.get("failure", kinds.get("error")).get("message") or "").strip()
            failures.append(f"{name}: {message.splitlines()[0][:200] if message else key}")
        elif "skipped" in kinds:
            counts["skipped"] += 1
            if TIME_CAP in (kinds["skipped"].get("message") or ""):
                counts["cut"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures}


# --------------------------------------------------------------------------- the environment
def missing_modules(parts: tuple[Part, ...]) -> dict[str, list[str]]:
    """Module -> the parts that need it, for every module that cannot be imported."""
    out: dict[str, list[str]] = {}
    for part in parts:
        for module in part.needs:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                out.setdefault(module, []).append(part.name)
    return out


def project_root() -> Path:
    """The directory the `zoo` package is imported from (the working tree when run from it)."""
    import zoo

    return Path(zoo.__file__).resolve().parents[1]


# Set in the environment, it would make the TF32 entries full float32: each entry sets its own.
PRECISION_VAR = "JAX_DEFAULT_MATMUL_PRECISION"


def child_env(root: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment of the run's processes: `env` (the one this process started with) with
    the working tree first on PYTHONPATH and no JAX precision setting (every entry sets its
    own)."""
    out = {k: v for k, v in env.items() if k != PRECISION_VAR}
    out["PYTHONPATH"] = os.pathsep.join([str(root), *([env["PYTHONPATH"]]
                                                      if env.get("PYTHONPATH") else [])])
    return out


# --------------------------------------------------------------------------- output
class Tee:
    """A text stream writing to the terminal and to the run's log."""

    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
            s.flush()
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()

    def isatty(self) -> bool:
        return False


def run_child(argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float,
              out: Any) -> tuple[int | None, bool]:
    """Run `argv`, its output copied line by line to `out`; stopped (its whole process group)
    after `timeout_s`. Returns (exit status, stopped)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=max(1.0, timeout_s))
        stopped = False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        rc = proc.wait()
        stopped = True
    reader.join(timeout=10)
    return rc, stopped


def copy_out(device_dir: str, out_env: str | None) -> str | None:
    """Copy the device's folder (records, README, plots, log) to $OUT/<device>/; returns the
    destination, None when $OUT is not set."""
    if not out_env:
        return None
    dest = os.path.join(out_env, os.path.basename(os.path.normpath(device_dir)))
    shutil.copytree(device_dir, dest, dirs_exist_ok=True)
    return dest


# --------------------------------------------------------------------------- the worker
def worker_main(args: Any) -> int:
    """Run the bench parts' entries from slot `args.first` on, in this process (the
    orchestrator stops it at the last bench part's end); events go to `args.progress`."""
    import jax

    from zoo.bench.accel import configure_allocator
    from zoo.bench.display import make_console

    allocator = configure_allocator(torch_in_process=True)
    cache = None
    if args.dry_run:  # code paths, not speed: compile as the test suite does (~40% less time)
        jax.config.update("jax_disable_most_optimizations", True)
    else:  # a program compiled again (the strict pass of every precision) is read back
        cache = os.path.join(tempfile.gettempdir(), "zoo-gpu-jax-cache")
        jax.config.update("jax_compilation_cache_dir", cache)
    from zoo.bench.peaks import device_slug

    console = make_console()
    parts = select(args.only)
    skipped = frozenset(p for ps in missing_modules(parts).values() for p in ps)
    slots = bench_slots(parts, args.dry_run, args.start, args.budget_min * 60, skipped)
    end = args.start + args.budget_min * 60
    measured = {} if args.dry_run else measured_times(os.path.join(args.out, device_slug()))
    extra = {"gpu_run": {"command": COMMAND + (" --dry-run" if args.dry_run else ""),
                         "dry_run": args.dry_run, "budget_min": args.budget_min,
                         "compilation_cache": cache}}

    def run_one(entry: Entry) -> str | None:
        try:
            return run_entry(entry, args.out, console, allocator,
                             {**extra, "gpu_run": {**extra["gpu_run"], "part": entry.group}})
        finally:
            gc.collect()
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available():
                torch.cuda.empty_cache()  # PyTorch's cached blocks back for JAX's next entry

    def on_event(i: int, event: str, entry: Entry, problem: str | None = None) -> None:
        with open(args.progress, "a") as f:
            f.write(json.dumps({"slot": i, "event": event, "command": entry.command,
                                "problem": problem}) + "\n")

    outcome = run_slots(slots, run_one, console, size="quick" if args.dry_run else "full",
                        end=end, measured=measured, keep_going=True, on_event=on_event,
                        first=args.first)
    print_skipped(outcome, args.out, console)
    return 3 if outcome.problems else 0


def read_progress(path: str) -> list[dict[str, Any]]:
    """The worker's events (a line cut by a stopped worker is left out)."""
    if not os.path.exists(path):
        return []
    events = []
    with open(path) as f:
        for line in f:
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events


# --------------------------------------------------------------------------- the run
@dataclass
class Run:
    """The orchestrator's state: options, clock, console, where things go."""

    dry: bool
    budget_s: float
    out: str
    parts: tuple[Part, ...]
    start: float
    console: Any
    root: Path
    env: dict[str, str]
    device_dir: str = ""
    problems: list[str] = dataclasses.field(default_factory=list)
    summary: list[str] = dataclasses.field(default_factory=list)

    @property
    def end(self) -> float:
        return self.start + self.budget_s


def _header(run: Run, title: str, end: float, doc: str = "") -> None:
    now = time.time()
    run.console.rule(f"[bold]{title}[/]: {fmt_left(end - now)} for it, "
                     f"{fmt_left(run.end - now)} left")
    if doc:
        run.console.print(doc, style="dim")


def _env_part(run: Run, missing: dict[str, list[str]]) -> None:
    import jax

    from zoo.bench.records import record_base, write_json

    record = record_base("environment")
    dev = record["device"]
    gpu = dev.get("gpu") or {}
    where = ("working tree" if (run.root / "pyproject.toml").exists() else "installed copy")
    run.console.print(f"zoo from {run.root} ({where}); children get PYTHONPATH={run.root}")
    run.console.print(f"device: {dev['name']} ({jax.default_backend()})"
                      + (f", driver {gpu['driver']}" if gpu.get("driver") else "")
                      + (f", {gpu['memory']}" if gpu.get("memory") else ""))
    v = record["versions"]
    run.console.print("versions: " + ", ".join(f"{k} {v[k]}" for k in (
        "jax", "flax", "equinox", "optax", "torch", "python") if v.get(k))
        + (f"; CUDA {v['jax_cuda']}" if v.get("jax_cuda") else ""))
    torch = sys.modules.get("torch")
    if jax.default_backend() == "gpu" and torch is not None and not torch.cuda.is_available():
        record["torch_without_cuda"] = True
        run.console.print("[bold red]PyTorch sees no CUDA device: its rows run on the CPU[/]")
    if PRECISION_VAR in os.environ:
        run.console.print(f"[yellow]{PRECISION_VAR}={os.environ[PRECISION_VAR]} is not passed "
                          "on: each entry sets its precision[/]")
    line = ("missing: none" if not missing else "missing: " + "; ".join(
        f"{m} ({', '.join(parts)} skipped)" for m, parts in missing.items()))
    run.console.print(line, style="bold red" if missing else "green")
    record.update({"missing": missing, "zoo_root": str(run.root), "dry_run": run.dry,
                   "budget_min": run.budget_s / 60,
                   "parts": [{"name": p.name, "share": p.share, "doc": p.doc}
                             for p in run.parts]})
    write_json(record, os.path.join(run.device_dir, "gpu-environment.json"))


def _tests_part(run: Run, part: Part, window: tuple[float, float]) -> None:
    from zoo.bench.records import record_base, write_json

    junit = os.path.join(run.device_dir, "gpu-tests.junit.xml")
    with contextlib.suppress(FileNotFoundError):
        os.remove(junit)
    hard = window[1] - time.time()
    workers = xdist_workers(run.dry)
    argv = pytest_command(part, run.dry, hard - TESTS_GRACE_S, junit, workers)
    run.console.print(shown(argv), highlight=False)
    started = time.time()
    rc, stopped = run_child(argv, run.env, run.root, hard, run.console.file)
    record = record_base("tests")
    record.update({"command": shown(argv), "wall_s": time.time() - started, "exit_status": rc,
                   "stopped_at_part_end": stopped, "dry_run": run.dry})
    summary = junit_summary(junit) if os.path.exists(junit) else None
    if summary is not None:
        record["summary"] = summary
        text = (f"tests: {summary['passed']} passed, {summary['failed']} failed, "
                f"{summary['errors']} errors, {summary['skipped'] - summary['cut']} skipped, "
                f"{summary['cut']} cut by the time cap")
    else:
        text = f"tests: stopped at the part's end (exit {rc}), no JUnit file"
    run.summary.append(text)
    run.console.print(text)
    if stopped or (summary and summary["cut"]):
        run.console.print("[yellow]all of them, without the cap: "
                          + shown(pytest_command(part, run.dry, None, None, workers)) + "[/]")
    if rc not in (0, 5) or stopped:
        run.problems.append(text)
    write_json(record, os.path.join(run.device_dir, "gpu-tests.json"))


def _bench_parts(run: Run, parts: list[Part], exclude: frozenset[str], end: float) -> None:
    """The bench parts' entries in one worker process, stopped at `end`; a crashed worker
    restarts after the entry that crashed."""
    progress = os.path.join(run.device_dir, "gpu-progress.jsonl")
    with contextlib.suppress(FileNotFoundError):
        os.remove(progress)
    slots = bench_slots(run.parts, run.dry, run.start, run.budget_s, exclude)
    windows = part_windows(run.parts, run.start, run.budget_s)
    for part in parts:
        n = sum(1 for s in slots if s.part == part.name)
        until = fmt_left(windows[part.name][1] - run.start)
        run.console.print(f"{part.name} ({n} {'entry' if n == 1 else 'entries'}, until "
                          f"{until}): {part.doc}", style="dim")
    first = 0
    while first < len(slots) and time.time() < end - 1:
        argv = [sys.executable, "-m", "zoo.bench", "gpu", "--worker", "--out", run.out,
                "--start", repr(run.start), "--budget-min", repr(run.budget_s / 60),
                "--progress", progress, "--first", str(first),
                "--only", ",".join(p.name for p in run.parts), *(["--dry-run"] if run.dry else [])]
        rc, stopped = run_child(argv, run.env, run.root, end - time.time(), run.console.file)
        events = read_progress(progress)
        started = {e["slot"]: e["command"] for e in events if e["event"] == "start"}
        finished = {e["slot"] for e in events if e["event"] in ("end", "skip")}
        cut = sorted(i for i in started if i not in finished)
        if rc in (0, 3) and not stopped:
            break
        if stopped:
            what = f" while running {started[cut[-1]]}" if cut else ""
            run.problems.append(f"benchmarks stopped at their end{what}")
        elif cut:
            run.problems.append(f"crashed (exit {rc}): {started[cut[-1]]}")
        else:
            run.problems.append(f"the benchmark process failed (exit {rc})")
        run.console.print(f"[bold red]{run.problems[-1]}[/]")
        if stopped or not cut:
            break
        first = cut[-1] + 1
    events = read_progress(progress)
    run.problems += [e["problem"] for e in events if e.get("problem")]
    seen = {e["slot"] for e in events}
    not_run = [s for i, s in enumerate(slots) if i not in seen]
    for slot in not_run:
        run.console.print(f"[yellow]not run (time), run it alone: {slot.entry.command} "
                          f"--record --results-dir {run.out}[/]")
    ran = sum(1 for e in events if e["event"] == "end")
    skipped = sum(1 for e in events if e["event"] == "skip") + len(not_run)
    run.summary.append(f"benchmarks: {ran} entries run, {skipped} skipped, "
                       f"{sum(1 for e in events if e.get('problem'))} with a problem")


def _report_part(run: Run) -> None:
    from zoo.bench.report import render

    try:
        render(run.device_dir, os.path.join(run.device_dir, "README.md"),
               os.path.join(run.device_dir, "plots"))
        run.console.print(f"wrote {run.device_dir}/README.md and plots/")
    except FileNotFoundError as e:
        run.console.print(f"[yellow]report: {e}[/]")


def gpu_parser() -> ArgumentParser:
    p = ArgumentParser(prog=COMMAND, description="Everything the zoo measures on a GPU, in one "
                       "budgeted run (docs/benchmarks_gpu.md).",
                       epilog="parts: " + ", ".join(f"{p.name} ({p.share:.0%})" for p in PARTS)
                              + ". Exit status: 0 ok, 2 bad arguments or no GPU, 3 a problem "
                                "(a failed test, a refused or crashed entry).")
    p.add_argument("--dry-run", action="store_true",
                   help="every part with tiny shapes (CPU, under 2 minutes); records go to a "
                        "temporary folder unless --out is given")
    p.add_argument("--budget-min", type=float, default=BUDGET_MIN, metavar="M",
                   help=f"the whole run's time, in minutes (default {BUDGET_MIN:g})")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="records, log, README and plots go to DIR/<device>/ (default "
                        "bench/results)")
    p.add_argument("--only", default=None, metavar="PARTS",
                   help="comma list of parts to run (the budget shared among them in the "
                        "same proportions)")
    # The benchmark worker the command starts (not for users).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--progress", default=None, help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    return p


def require_backend(dry: bool, parser: ArgumentParser) -> None:
    """Start JAX's backend in this process (a probe: no preallocation) and refuse a real run
    where it is no GPU, in one line."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    if not dry and jax.default_backend() != "gpu":
        parser.error(f"JAX sees no GPU (backend {jax.default_backend()}); on a CPU, check the "
                     f"command with: {COMMAND} --dry-run")


def gpu_main(argv: list[str]) -> int:
    parser = gpu_parser()
    args = parser.parse_args(argv)
    if args.budget_min <= 0:
        parser.error(f"--budget-min must be positive, got {args.budget_min:g}")
    try:
        parts = select(args.only)
    except ValueError as e:
        parser.error(str(e))
    if args.worker:
        return worker_main(args)
    start = time.time()
    env = dict(os.environ)  # the children configure their own allocator
    require_backend(args.dry_run, parser)
    from zoo.bench.display import make_console
    from zoo.bench.peaks import device_slug

    root = project_root()
    out = os.path.abspath(args.out or (tempfile.mkdtemp(prefix="zoo-gpu-dry-run-")
                                       if args.dry_run else root / "bench" / "results"))
    device_dir = os.path.join(out, device_slug())
    os.makedirs(device_dir, exist_ok=True)
    log = open(os.path.join(device_dir, "gpu-run.log"), "w")  # noqa: SIM115  (closed below)
    from rich.console import Console

    console = Console(file=Tee(sys.stdout, log), width=make_console().width)
    run = Run(args.dry_run, args.budget_min * 60, out, parts, start, console, root,
              child_env(root, env), device_dir)
    windows = part_windows(parts, start, run.budget_s)
    console.print(f"{COMMAND}{' --dry-run' if run.dry else ''}: {len(parts)} parts in "
                  f"{fmt_left(run.budget_s)} (m:ss); records in {device_dir}/")
    missing = missing_modules(parts)
    unable = frozenset(p for ps in missing.values() for p in ps)

    def unable_to_run(part: Part) -> bool:
        if part.name in unable:
            console.print(f"[yellow]skipped: {part.name} needs "
                          + ", ".join(m for m, p in missing.items() if part.name in p) + "[/]")
        return part.name in unable

    out_env = os.environ.get("OUT")
    try:
        for bench, group in itertools.groupby(parts, key=lambda p: p.kind == "bench"):
            group = list(group)
            if bench:  # consecutive bench parts: one worker process
                _header(run, "benchmarks", windows[group[-1].name][1])
                if not all([unable_to_run(p) for p in group]):
                    _bench_parts(run, group, unable, windows[group[-1].name][1])
            for part in () if bench else group:
                _header(run, part.name, windows[part.name][1], part.doc)
                if unable_to_run(part):
                    continue
                if part.kind == "env":
                    _env_part(run, missing)
                elif part.kind == "tests":
                    _tests_part(run, part, windows[part.name])
                elif part.kind == "report":
                    _report_part(run)
            copy_out(device_dir, out_env)  # what is done so far, should the run be cut
        console.rule(f"done in {fmt_left(time.time() - start)} of {fmt_left(run.budget_s)}")
        for line in run.summary:
            console.print(line)
        for problem in run.problems:
            console.print(f"[red]problem: {problem}[/]")
        console.print(f"records, log, README and plots: {device_dir}/")
    finally:
        log.close()
        dest = copy_out(device_dir, out_env)
    if dest:
        print(f"copied to {dest}/")
    return 3 if run.problems else 0
