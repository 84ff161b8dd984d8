"""`python -m zoo.bench gpu [--dry-run]`: everything the zoo measures on a GPU, in one run.

The run is a list of parts (`PARTS`: data): the environment, the GPU tests (one process, each
outcome logged as it ends, capped), the seeds' questions (the 3-D conv-transpose at
(4, 4, 256^3), the CNN in NNX against Linen, the dispatch suite with its 10,000 static leaves),
ResNet-50, ViT-B/16 and the U-Net in TF32 and bfloat16, GPT-2 prefill and decode, and the
report. Before anything starts, `plan` fits the budget (`--budget-min`, 9 by default) with the
estimates the 2026-11-27 H100 run measured (`H100_LOG`): each entry in its first form that
leaves room for the cheapest form of every later one (full, without torch.compile, then
smaller shapes: `cuts`), and every part's estimate and end are printed. A part ends by the sum
of the planned seconds of the parts before it and its own (the slack shared in proportion):
one that ends early leaves its time to the next; at run time an entry that no longer fits is
cut further (`zoo.bench.matrix.Schedule`), or skipped with the command that runs it alone.
Every entry names its `--precision`, and its record states it.

The benchmarks run in one worker process that is stopped at the end of the last benchmark part
whatever happens (a hang cannot eat the report's time); a crashed worker is restarted after the
entry that crashed. Records (JSON: device, driver, library versions, precision), the plan, the
run's log, a README and plots go to `--out/<device>/`, and are copied to `$OUT/<device>/` after
every part when `$OUT` is set (what is done survives a run cut short).

`--dry-run` runs every part's code path with tiny shapes (CPU, a few minutes), its tests
including the replays of the H100 log (`tests/test_bench_gpu_log.py`): the command is known to
work before GPU time is spent.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.arguments import ArgumentParser
from zoo.bench import testlog
from zoo.bench.accel import configure_allocator
from zoo.bench.display import make_console
from zoo.bench.matrix import (
    Entry,
    Schedule,
    Slot,
    arguments,
    fmt_left,
    measured_times,
    print_skipped,
    run_entry,
    run_slots,
)
from zoo.bench.peaks import device_slug
from zoo.bench.records import record_base, write_json
from zoo.layers.conv_transpose import METHODS

BUDGET_MIN = 9.0
# The dry run's default budget: its entries take minutes of a small CPU, and their estimates
# are rough there (it checks code paths, not speed).
DRY_BUDGET_MIN = 15.0
COMMAND = "python -m zoo.bench gpu"
TIMING = ("--repeat", "20", "--warmup", "3", "--rounds", "5", "--settle", "50", "--no-progress")
DRY_TIMING = ("--repeat", "1", "--warmup", "0", "--rounds", "1", "--settle", "0",
              "--no-progress")

@dataclass(frozen=True)
class Bench:
    """`python -m zoo.bench ARCH [--preset PRESET] ARGS --precision PRECISION`; the dry run
    takes the `tiny` preset and `dry_args` (None: `args`). `torch_compile`: adds PyTorch's
    torch.compile style when there is time to spare (else the entry runs without it).
    `compile_s`: seconds per JAX compilation at this size, for the estimate (None:
    `zoo.bench.matrix.COMPILE_S`); `seconds`: the entry's whole time as the H100 log measured
    it (`H100_LOG`). `cuts`: smaller shapes of the same question, most wanted first, run when
    the full form does not fit. `timing`: the timing arguments (None: `TIMING`)."""

    arch: str
    preset: str | None = None
    args: tuple[str, ...] = ()
    dry_args: tuple[str, ...] | None = None
    torch_compile: bool = False
    compile_s: float | None = None
    seconds: float | None = None
    cuts: tuple[Bench, ...] = ()
    precision: str = "default"
    timing: tuple[str, ...] | None = None

    def entry(self, group: str, dry: bool) -> Entry:
        preset = ("--preset", "tiny") if dry else (
            ("--preset", self.preset) if self.preset else ())
        args = self.dry_args if dry and self.dry_args is not None else self.args
        timing = DRY_TIMING if dry else (self.timing if self.timing is not None else TIMING)
        argv = (self.arch, *preset, *args, "--precision", self.precision, *timing)
        cuts = () if dry else tuple(c.entry(group, dry) for c in self.cuts)
        if self.torch_compile and not dry:  # the dry run leaves Inductor out (CPU time)
            return Entry(group, (*argv, "--torch-compile"), fallback=argv,
                         compile_s=self.compile_s, seconds=self.seconds, cuts=cuts)
        return Entry(group, argv, compile_s=self.compile_s, seconds=self.seconds, cuts=cuts)


@dataclass(frozen=True)
class Dispatch:
    """`python -m zoo.bench dispatch ARGS --precision default` (the dry run: `dry_args`)."""

    args: tuple[str, ...]
    dry_args: tuple[str, ...]

    def entry(self, group: str, dry: bool) -> Entry:
        return Entry(group, ("dispatch", *(self.dry_args if dry else self.args),
                             "--precision", "default", "--no-progress"))


@dataclass(frozen=True)
class Part:
    """One part of the GPU run: what it is (`doc`), its `kind` (env, tests, bench or report),
    the modules it needs (`needs`; a part whose module is missing is skipped), its `seconds`
    (env, tests, report; a bench part's are its entries' estimates) and, for a bench part, its
    commands (`runs`), for the tests part its test files (`tests`; the dry run:
    `dry_tests`)."""

    name: str
    doc: str
    kind: str = "bench"
    runs: tuple[Bench | Dispatch, ...] = ()
    tests: tuple[str, ...] = ()
    dry_tests: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    seconds: float = 0.0

    def entries(self, dry: bool) -> list[Entry]:
        return [run.entry(self.name, dry) for run in self.runs]


CORE = ("jax", "flax", "equinox", "optax", "orbax.checkpoint", "safetensors", "numpy", "rich")
BENCH_NEEDS = (*CORE, "torch")
# The GPU tests: every library's device code against PyTorch and the precision policy, in ONE
# process (the H100 run's 8 xdist workers compiled at once, walked ~1,500 capped skips and were
# killed with no counts), the quick subset (`--quick`: 110 tests), most wanted first, stopped at
# `TESTS_CAP_S` (`zoo.bench.testlog`: each outcome written as it finishes).
GPU_TESTS = tuple(f"tests/test_{name}.py" for name in (
    "precision", "equivalence", "torch_reference", "fast"))
TESTS_CAP_S = 60.0
# Seconds the test part leaves around its cap: start-up (imports, collection) and the test
# running at the cap.
TESTS_GRACE_S = 20.0
# The dry run: values and gradients against PyTorch, and the replays of the H100 log.
DRY_TESTS = ("tests/test_activations.py", "tests/test_bench_gpu_log.py")
# The seed's conv-transpose: every formulation by name ("auto" is one of them on a GPU); the dry
# run two of them (a method comparison all the same).
CONVT_METHODS = ("--method", ",".join(METHODS))
DRY_METHODS = ("--method", "lhs_dilation,im2col")
# One fairness pass per program, at the precision timed (`--check timed`): every compilation
# costs seconds on the GPU, the strict pass is the test suite's (the tests part, and the CPU).
CHECK = ("--check", "timed")

# What the 2026-11-27 H100 run measured (../docs/benchmarks_gpu.md, "The first run"), in
# seconds: each entry's strict fairness pass alone (every entry but the CNN was refused or
# stopped before timing), and the CNN's whole entry (its record's wall_s).
H100_LOG = {"convt-256 forward strict pass": 65.0, "convt-256 train strict pass": 55.0,
            "resnet50-224 strict pass": 86.0, "vit-b16 strict pass (unfinished)": 83.0,
            "cnn b64 entry": 31.1}
# Per program of the strict pass (compile + first call + counts + outputs to the host):
# convt 65 s / 15 programs; ResNet-50 (86 s - 8 s of PyTorch) / 6.
CONVT_COMPILE_S = round(H100_LOG["convt-256 forward strict pass"] / 15, 1)
RESNET50_COMPILE_S = round((H100_LOG["resnet50-224 strict pass"] - 8) / 6, 1)
# The models at realistic sizes, each with its cuts (a smaller shape that compiles faster):
# (subject, preset, seconds per program, cuts as (preset, extra args, seconds per program)).
MODEL_PRESETS: tuple[tuple[str, str, float, tuple[tuple[str, tuple[str, ...], float], ...]],
                     ...] = (
    ("resnet", "resnet50-224", RESNET50_COMPILE_S,
     (("resnet18-224", (), RESNET50_COMPILE_S * 18 / 50),
      ("resnet18-224", ("--mode", "forward"), RESNET50_COMPILE_S * 18 / 50))),
    # ViT-B/16 did not finish its strict pass in 83 s: more than 83 / 6 s per program; its cut
    # keeps 4 of the 12 blocks (compilation grows with the blocks unrolled).
    ("vit", "vit-b16", round(H100_LOG["vit-b16 strict pass (unfinished)"] / 6 + 1, 1),
     (("vit-b16", ("--config", '{"depth": 4}'), 5.0),
                              ("vit-b16", ("--config", '{"depth": 2}', "--mode", "forward"),
                               3.0))),
    ("unet3d", "unet3d-128", 13.0, (("unet3d-64", (), 8.0),
                                    ("unet3d-64", ("--mode", "forward"), 8.0))))
# TF32 (float32 at the libraries' default precision) and bfloat16; full float32 is the
# fairness pass of the test suite.
PRECISIONS: tuple[tuple[str, ...], ...] = ((), ("--dtype", "bfloat16"))


def preset_runs(presets: tuple = MODEL_PRESETS) -> tuple[Bench, ...]:
    """Each model preset in every precision, every library against PyTorch eager
    (torch.compile with time to spare), forward and training, with its cuts. The dry run
    times the forward pass of Equinox and PyTorch (as `matrix --quick` does: every library on
    the tiny presets is the test suite's job)."""
    runs = []
    for precision in PRECISIONS:
        for arch, preset, compile_s, cuts in presets:
            args = ("--call", "default", *precision, *CHECK)
            runs.append(Bench(
                arch, preset, ("--impl", "all", *args),
                ("--mode", "forward", "--impl", "eqx,torch", *args), torch_compile=True,
                compile_s=compile_s,
                cuts=tuple(Bench(arch, p, ("--impl", "all", *extra, *args), compile_s=c)
                           for p, extra, c in cuts)))
    return tuple(runs)


# Flags of a plan's printout that say how long, not what (left out of its "->" lines).
TIMING_FLAGS = frozenset(("--prompt", "--new-tokens", "--repeat", "--warmup", "--rounds",
                          "--settle"))
# GPT-2 (124M) prefill and decode, every library and PyTorch (transformers' generate too);
# `--mode decode` times both. Cut: 4 of its 12 layers, then 8 new tokens.
GENERATION_TIMING = ("--prompt", "32", "--new-tokens", "32", "--repeat", "3", "--no-progress")


def generation_runs() -> tuple[Bench, ...]:
    """GPT-2 at batch 1 and 8, float32 (TF32) and bfloat16, at the default precision."""
    runs = []
    for dtype in ("float32", "bfloat16"):
        for batch in ("1", "8"):
            args = ("--mode", "decode", "--impl", "all", "--batch", batch, "--dtype", dtype)
            runs.append(Bench(
                "gpt2", "gpt2-124m", args, ("--mode", "decode", "--impl", "eqx,torch",
                                            "--batch", batch, "--dtype", dtype,
                                            "--no-transformers", "--prompt", "4",
                                            "--new-tokens", "4"),
                compile_s=3.0, timing=GENERATION_TIMING,
                cuts=(Bench("gpt2", "gpt2-124m", (*args, "--config", '{"n_layer": 4}'),
                            compile_s=1.5, timing=GENERATION_TIMING),
                      Bench("gpt2", "gpt2-124m", (*args, "--config", '{"n_layer": 2}'),
                            compile_s=1.0, timing=("--prompt", "16", "--new-tokens", "8",
                                                   "--repeat", "2", "--no-progress")))))
    return tuple(runs)


# The run, most wanted first (the plan cuts the later entries first).
PARTS: tuple[Part, ...] = (
    Part("env", "the working tree, the packages every part needs, the GPU", kind="env",
         seconds=10.0),
    Part("tests", "the GPU tests in one process, each outcome logged as it ends, capped",
         kind="tests", tests=GPU_TESTS, dry_tests=DRY_TESTS,
         needs=(*BENCH_NEEDS, "pytest", "hypothesis", "chex", "torchvision", "timm",
                "transformers"), seconds=TESTS_CAP_S + TESTS_GRACE_S),
    Part("convt", "seed: the 3-D conv-transpose at (4, 4, 256^3), every method, the "
         "three libraries and PyTorch, forward and training",
         runs=(Bench("convt", "convt-256", ("--mode", "forward", "--impl", "all",
                                            *CONVT_METHODS, *CHECK),
                     ("--mode", "forward", *DRY_METHODS, *CHECK), torch_compile=True,
                     compile_s=CONVT_COMPILE_S),
               Bench("convt", "convt-256", ("--mode", "train", "--impl", "all",
                                            *CONVT_METHODS, *CHECK),
                     ("--mode", "train", *DRY_METHODS, *CHECK), torch_compile=True,
                     compile_s=round(H100_LOG["convt-256 train strict pass"] / 15, 1))),
         needs=BENCH_NEEDS),
    Part("cnn", "seed: the CNN in NNX against Linen, fastest and idiomatic call styles",
         runs=(Bench("cnn", None, ("--mode", "both", "--impl", "linen,nnx", "--call",
                                   "default,idiomatic"),
                     ("--mode", "forward", "--impl", "linen,nnx", "--call",
                      "default,idiomatic"), seconds=H100_LOG["cnn b64 entry"]),),
         needs=BENCH_NEEDS),
    Part("dispatch", "seed: the dispatch suite (identity, MLP, MLP training step, and "
         "the 10,000 static leaves a call flattens)",
         runs=(Dispatch(("--impl", "all", "--rounds", "20", "--budget", "0.005"),
                        ("--impl", "eqx,torch", "--workload", "static10k,mlp_train",
                         "--rounds", "1", "--budget", "0.0005", "--tiny")),),
         needs=BENCH_NEEDS),
    Part("presets", "ResNet-50 at 224, ViT-B/16, the 3-D U-Net at 128^3: TF32 (the "
         "default) and bfloat16, every library against PyTorch eager (and torch.compile "
         "with time to spare)", runs=preset_runs(), needs=BENCH_NEEDS),
    Part("lm", "GPT-2 (124M) prefill and decode, batch 1 and 8, float32 (TF32) and "
         "bfloat16, every library against PyTorch and transformers", runs=generation_runs(),
         needs=(*BENCH_NEEDS, "transformers")),
    Part("extra", "with time to spare: the bf16 conv-transpose weight gradient "
         "(convt-wgrad, jax-ml/jax#31662), every method",
         runs=(Bench("convt", "convt-wgrad", ("--mode", "train", "--dtype", "bfloat16",
                                              "--impl", "all", *CONVT_METHODS, *CHECK),
                     ("--mode", "train", "--dtype", "bfloat16", *DRY_METHODS, *CHECK)),),
         needs=BENCH_NEEDS),
    Part("report", "the README and plots of the records; the copy to $OUT", kind="report",
         needs=("matplotlib",), seconds=15.0),
)


# --------------------------------------------------------------------------- the budget
@dataclass(frozen=True)
class Planned:
    """An entry as planned: the form chosen (None: no form fits), its estimate, the entry."""

    entry: Entry
    form: Entry | None
    estimate_s: float


def plan(parts: tuple[Part, ...], dry: bool, budget_s: float,
         measured: dict[str, float] | None = None) -> list[Planned]:
    """The forms that fit `budget_s`: entries in order, each its first form (`Entry.forms`:
    full, without torch.compile, its cuts) that leaves room for the cheapest form of every
    later entry, else its cheapest form if that fits; what does not fit is planned as None
    (printed, never dropped silently). The fixed parts' seconds are taken first."""
    schedule = Schedule([], "quick" if dry else "full", measured)
    entries = [e for p in parts if p.kind == "bench" for e in p.entries(dry)]
    left = budget_s - sum(p.seconds for p in parts if p.kind != "bench")
    out = []
    for i, entry in enumerate(entries):
        reserve = sum(schedule.cheapest(e) for e in entries[i + 1:])
        forms = [(f, schedule.estimate(f)) for f in entry.forms()]
        fits = [fe for fe in forms if fe[1] + reserve <= left] or [
            min(forms, key=lambda fe: fe[1])]
        form, estimate = fits[0]
        if estimate > left:
            out.append(Planned(entry, None, estimate))
            continue
        left -= estimate
        out.append(Planned(entry, form, estimate))
    return out


def planned_entry(p: Planned) -> Entry | None:
    """The entry the run starts with: the planned form, the cheaper forms after it as its
    cuts (the run may cut further when it is late)."""
    if p.form is None:
        return None
    forms = p.entry.forms()
    at = next(i for i, f in enumerate(forms) if f.argv == p.form.argv)
    return dataclasses.replace(p.form, fallback=None, cuts=tuple(forms[at + 1:]))


def part_windows(parts: tuple[Part, ...], start: float, budget_s: float,
                 planned: list[Planned]) -> dict[str, tuple[float, float]]:
    """Part name -> (start, end): each part's planned seconds (fixed, or its planned entries'
    estimates), the budget's slack shared in proportion; part i ends by start + the sum of
    parts 0..i, so a part that ends early leaves its time to the next."""
    need = {p.name: p.seconds for p in parts}
    for q in planned:
        if q.form is not None:
            need[q.entry.group] += q.estimate_s
    scale = budget_s / max(sum(need.values()), 1e-9)
    out, at = {}, start
    for p in parts:
        end = at + need[p.name] * scale
        out[p.name] = (at, end)
        at = end
    return out


def bench_slots(parts: tuple[Part, ...], planned: list[Planned],
                windows: dict[str, tuple[float, float]],
                exclude: frozenset[str] = frozenset()) -> list[Slot]:
    """The planned entries of the bench parts (but those in `exclude`), each with its part's
    end as deadline; an entry planned as None keeps its cheapest form (the schedule skips it,
    saying so, unless the run is early)."""
    slots = []
    for q in planned:
        if q.entry.group in exclude:
            continue
        entry = planned_entry(q) or dataclasses.replace(
            q.entry.forms()[-1], fallback=None, cuts=())
        slots.append(Slot(entry, q.entry.group, windows[q.entry.group][1]))
    return slots


def print_plan(parts: tuple[Part, ...], planned: list[Planned],
               windows: dict[str, tuple[float, float]], start: float, console: Any) -> None:
    """Every part's estimate and end, every entry's planned form, before anything starts."""
    for p in parts:
        mine = [q for q in planned if q.entry.group == p.name]
        est = p.seconds + sum(q.estimate_s for q in mine if q.form is not None)
        console.print(f"{p.name:9} est. {fmt_left(est)}, ends by "
                      f"{fmt_left(windows[p.name][1] - start)}"
                      + (f", {len(mine)} entr{'y' if len(mine) == 1 else 'ies'}"
                         if mine else ""), highlight=False)
        for q in mine:
            state = "does not fit" if q.form is None else f"{q.estimate_s:3.0f} s"
            why = "" if q.form is None else change(q.entry.argv, q.form.argv)
            console.print(f"  {state} {label(q.entry.argv)}{why}"[:80], highlight=False)


def change(full: tuple[str, ...], form: tuple[str, ...]) -> str:
    """What a planned form changes, shortly: ": no --torch-compile", ": -> --preset P"."""
    before, after = arguments(full), arguments(form)
    added = [a for a in after if a not in before and a.split()[0] not in TIMING_FLAGS]
    if added:
        return ": -> " + " ".join(added)
    gone = [a for a in before if a not in after]
    return ": no " + " ".join(gone) if gone else ""


def label(argv: tuple[str, ...]) -> str:
    """An entry in a few words: the subject and its preset, mode, dtype and batch."""
    flags = {"--preset": "", "--mode": "", "--dtype": "", "--batch": "b"}
    return " ".join([argv[0], *(prefix + argv[argv.index(f) + 1]
                                for f, prefix in flags.items() if f in argv)])


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
def pytest_command(part: Part, dry: bool, cap_s: float | None, log: str | None,
                   junit: str | None = None) -> list[str]:
    """The test part's command: one process, its files (the quick subset on the GPU),
    `cpu_only` tests left out, each outcome written to `log` as it finishes
    (`zoo.bench.testlog`), no test started after `cap_s` (None: no cap), a JUnit file,
    failures and errors listed."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "-p", "zoo.bench.testlog", "-rfE", "-m", "not cpu_only",
            "--continue-on-collection-errors"]
    if not dry:
        argv.append("--quick")
    if cap_s is not None:
        argv += ["--stop-after", f"{max(0.0, cap_s):.0f}"]
    if log is not None:
        argv.append(f"--test-log={log}")
    if junit is not None:
        argv.append(f"--junitxml={junit}")
    return argv + list(part.dry_tests if dry else part.tests)


def shown(argv: list[str]) -> str:
    """A child's command line as the user would type it."""
    return shlex.join(["python", *argv[1:]])


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

    allocator = configure_allocator(torch_in_process=True)
    cache = None
    if args.dry_run:  # code paths, not speed: compile as the test suite does (~40% less time)
        jax.config.update("jax_disable_most_optimizations", True)
    else:  # a program compiled again (a rerun on the same machine) is read back
        cache = os.path.join(tempfile.gettempdir(), "zoo-gpu-jax-cache")
        jax.config.update("jax_compilation_cache_dir", cache)

    console = make_console()
    slots, measured = read_plan(args.plan)
    end = args.start + args.budget_min * 60
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


def write_plan(path: str, slots: list[Slot], measured: dict[str, float],
               planned: list[Planned]) -> None:
    """The run's plan (`gpu-plan.json`): the slots the worker runs (a restarted worker runs
    the same ones), the measured times it budgets with, and every entry's planned form."""
    with open(path, "w") as f:
        json.dump({"slots": [{"entry": s.entry.to_dict(), "part": s.part,
                              "deadline": s.deadline} for s in slots],
                   "measured": measured,
                   "planned": [{"command": q.entry.command,
                                "form": q.form.command if q.form else None,
                                "estimate_s": q.estimate_s} for q in planned]}, f, indent=1)


def read_plan(path: str) -> tuple[list[Slot], dict[str, float]]:
    """(slots, measured times) of a plan written by `write_plan`."""
    with open(path) as f:
        data = json.load(f)
    return ([Slot(Entry.from_dict(s["entry"]), s["part"], s["deadline"])
             for s in data["slots"]], data["measured"])


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
    windows: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    slots: list[Slot] = dataclasses.field(default_factory=list)
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
                   "parts": [{"name": p.name, "doc": p.doc,
                              "window_s": [w - run.start for w in run.windows[p.name]]}
                             for p in run.parts]})
    write_json(record, os.path.join(run.device_dir, "gpu-environment.json"))


def _tests_part(run: Run, part: Part, window: tuple[float, float]) -> None:
    log = os.path.join(run.device_dir, "gpu-tests.jsonl")
    junit = os.path.join(run.device_dir, "gpu-tests.junit.xml")
    for path in (log, junit):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    hard = window[1] - time.time()
    cap = min(TESTS_CAP_S, hard - TESTS_GRACE_S)
    argv = pytest_command(part, run.dry, None if run.dry else cap, log, junit)
    run.console.print(shown(argv), highlight=False)
    started = time.time()
    rc, stopped = run_child(argv, run.env, run.root, hard, run.console.file)
    record = record_base("tests")
    record.update({"command": shown(argv), "wall_s": time.time() - started, "exit_status": rc,
                   "stopped_at_part_end": stopped, "dry_run": run.dry})
    summary = testlog.summary(log) if os.path.exists(log) else None
    if summary is not None:
        record["summary"] = summary
        text = (f"tests: {summary['passed']} passed, {summary['failed']} failed, "
                f"{summary['errors']} errors, {summary['skipped']} skipped, "
                f"{summary['cut']} of {summary['collected']} not run (cap)")
    else:
        text = f"tests: stopped before collecting (exit {rc}), no test log"
    run.summary.append(text)
    run.console.print(text)
    if summary and summary["cut"]:
        run.console.print("[yellow]all of them, without the cap: "
                          + shown(pytest_command(part, run.dry, None, None)) + "[/]")
    # 2: pytest's status when the cap stopped the session; 5: nothing collected.
    failed = bool(summary and (summary["failed"] or summary["errors"]))
    if failed or summary is None or (rc not in (0, 2, 5) and not stopped):
        run.problems.append(text)
    elif stopped:
        run.problems.append(f"tests: stopped at the part's end ({text[7:]})")
    write_json(record, os.path.join(run.device_dir, "gpu-tests.json"))


def _bench_parts(run: Run, parts: list[Part], end: float) -> None:
    """The bench parts' planned entries in one worker process, stopped at `end`; a crashed
    worker restarts after the entry that crashed."""
    progress = os.path.join(run.device_dir, "gpu-progress.jsonl")
    with contextlib.suppress(FileNotFoundError):
        os.remove(progress)
    names = {p.name for p in parts}
    slots = [s for s in run.slots if s.part in names]
    plan_path = os.path.join(run.device_dir, "gpu-plan.json")
    first = next((i for i, s in enumerate(run.slots) if s.part in names), len(run.slots))
    while first < len(run.slots) and time.time() < end - 1:
        argv = [sys.executable, "-m", "zoo.bench", "gpu", "--worker", "--out", run.out,
                "--start", repr(run.start), "--budget-min", repr(run.budget_s / 60),
                "--progress", progress, "--first", str(first), "--plan", plan_path,
                *(["--dry-run"] if run.dry else [])]
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
    not_run = [s for i, s in enumerate(run.slots) if i not in seen and s.part in names]
    for slot in not_run:
        run.console.print(f"[yellow]not run (time), run it alone: {slot.entry.command} "
                          f"--record --results-dir {run.out}[/]")
    ran = sum(1 for e in events if e["event"] == "end")
    skipped = sum(1 for e in events if e["event"] == "skip") + len(not_run)
    run.summary.append(f"benchmarks: {ran} of {len(slots)} entries run, {skipped} skipped, "
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
                       epilog="parts: " + ", ".join(p.name for p in PARTS)
                              + ". Exit status: 0 ok, 2 bad arguments or no GPU, 3 a problem "
                                "(a failed test, a refused or crashed entry).")
    p.add_argument("--dry-run", action="store_true",
                   help="every part with tiny shapes (CPU, a few minutes); records go to a "
                        "temporary folder unless --out is given")
    p.add_argument("--budget-min", type=float, default=None, metavar="M",
                   help=f"the whole run's time, in minutes (default {BUDGET_MIN:g}, the "
                        f"dry run {DRY_BUDGET_MIN:g})")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="records, log, README and plots go to DIR/<device>/ (default "
                        "bench/results)")
    p.add_argument("--only", default=None, metavar="PARTS",
                   help="comma list of parts to run (the plan fits them to the budget)")
    # The benchmark worker the command starts (not for users).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--progress", default=None, help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--plan", default=None, help=argparse.SUPPRESS)
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
    if args.budget_min is None:
        args.budget_min = DRY_BUDGET_MIN if args.dry_run else BUDGET_MIN
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
    missing = missing_modules(parts)
    unable = frozenset(p for ps in missing.values() for p in ps)
    measured = {} if run.dry else measured_times(device_dir)
    planned = plan(parts, run.dry, run.budget_s, measured)
    run.windows = windows = part_windows(parts, start, run.budget_s, planned)
    run.slots = bench_slots(parts, planned, windows, unable)
    write_plan(os.path.join(device_dir, "gpu-plan.json"), run.slots, measured, planned)
    console.print(f"{COMMAND}{' --dry-run' if run.dry else ''}: {len(parts)} parts in "
                  f"{fmt_left(run.budget_s)} (m:ss); records in {device_dir}/")
    print_plan(parts, planned, windows, start, console)

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
                    _bench_parts(run, group, windows[group[-1].name][1])
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
