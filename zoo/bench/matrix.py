"""`python -m zoo.bench matrix --out DIR [--quick]`: the whole benchmark matrix in one command.

Every entry is a `python -m zoo.bench ...` command line (printed, and stored in its record), run
in this process one after the other, each record written to `DIR/<device>/`; render them with
`python -m zoo.bench report --results DIR`. The matrix:

- the runs the subjects declare (`BenchSpec.matrix`, every library, PyTorch eager and
  `torch.compile`): the published conv-transpose shapes (`convt-256` forward with every
  method, `convt-wgrad`: bfloat16 weight gradient), the Decoder3D training step;
- the dispatch suite;
- every architecture in the registry (`zoo.ARCHS`) x every implementation and call style
  (`torch.compile` included) x forward and train x float32 and bfloat16;
- the realistic sizes the subjects declare (`MatrixRun.sizes`, e.g. ResNet-18 at 224x224, the
  3-D U-Net at 128^3): every implementation, default call style, forward and train.

The full matrix is sized for one GPU call under 10 minutes: few timed steps (GPU steps take
milliseconds; compilation dominates) and a time budget (`--budget-min`): an entry whose
estimated cost no longer fits is skipped and its command printed, so the call always ends in
time and says what is left. `--quick` runs the same kinds of entry on the tiny presets without
`torch.compile` (CPU CI); `--subjects` keeps the entries of some subjects only (and the
dispatch suite, which has none).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any

import zoo
from zoo.arguments import ArgumentParser, positive_float, positive_int
from zoo.bench.accel import configure_allocator
from zoo.bench.display import make_console
from zoo.bench.fairness import FairnessError
from zoo.bench.generation import base_tokens
from zoo.bench.generation import styles as generation_styles
from zoo.bench.options import bench_parser, config_from_args, parse_impls
from zoo.bench.records import save, write_json
from zoo.bench.spec import MatrixRun, bench_archs, bench_spec
from zoo.bench.tables import print_model_record
from zoo.layers.conv_transpose import CHOICES
from zoo.libraries import IMPLS, JAX_IMPLS
from zoo.runtime import precision as policy

# Rough seconds per compilation, for the printed estimate and the budget. "full": an H100 host
# (XLA autotunes convolutions; torch.compile runs Inductor): `jax` from the 2026-11-27 H100
# run, whose CNN entry took 31.1 s for 12 compilations (each with its first call and its FLOP
# counts) and its timing; the rest guesses until GPU records give, per command, the entry's
# whole time (`wall_s`, which `measured_times` reads back as the estimate). `step`: seconds per
# timed or warm-up step; `dispatch`: compilations and warm-up of one dispatch workload;
# `generate`: one generation program (quick: a tiny GPT-2's, ~3 s on the 2-core machine).
COMPILE_S = {"quick": {"jax": 0.6, "torch_compile": 0.0, "entry": 1.0, "dispatch": 1.0,
                       "step": 0.002, "generate": 3.0},
             "full": {"jax": 2.1, "torch_compile": 15.0, "entry": 3.0, "dispatch": 3.0,
                      "step": 0.005, "generate": 2.1}}
JAX_STYLES_ALL = 10  # call styles of the three JAX libraries with --call all
DISPATCH_ROWS = 24  # timed rows of one dispatch workload (styles of every library, floors)


@dataclass(frozen=True)
class Entry:
    """One command of a budgeted plan: `argv` for `python -m zoo.bench`.

    `fallback`: a cheaper form of the same measurement (e.g. without `--torch-compile`), run
    instead when `argv` no longer fits. `cuts`: smaller shapes of the same question (e.g. a
    smaller preset), most wanted first, run when neither fits: cut, never skipped silently.
    `compile_s`: this entry's seconds per JAX compilation at full size, where its model
    compiles much slower than `COMPILE_S` says (realistic sizes). `seconds`: the entry's whole
    time at full size as measured on a GPU (a log's), preferred to the formula.
    """

    group: str
    argv: tuple[str, ...]
    fallback: tuple[str, ...] | None = None
    compile_s: float | None = None
    seconds: float | None = None
    cuts: tuple[Entry, ...] = ()

    @property
    def command(self) -> str:
        return "python -m zoo.bench " + " ".join(self.argv)

    def cheaper(self) -> Entry | None:
        """The fallback form as an entry of its own (None without one)."""
        if self.fallback is None:
            return None
        return dataclasses.replace(self, argv=self.fallback, fallback=None, seconds=None,
                                   cuts=())

    def forms(self) -> list[Entry]:
        """The entry, its fallback and its cuts: what may run for it, most wanted first."""
        fallback = self.cheaper()
        return [dataclasses.replace(self, cuts=()), *([fallback] if fallback else []),
                *self.cuts]

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "argv": list(self.argv),
                "fallback": list(self.fallback) if self.fallback else None,
                "compile_s": self.compile_s, "seconds": self.seconds,
                "cuts": [c.to_dict() for c in self.cuts]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Entry:
        return cls(d["group"], tuple(d["argv"]),
                   tuple(d["fallback"]) if d.get("fallback") else None, d.get("compile_s"),
                   d.get("seconds"), tuple(cls.from_dict(c) for c in d.get("cuts") or ()))

    def estimate_s(self, size: str) -> float:
        """The measured `seconds` (full size), else compilations x their rough cost
        (`COMPILE_S`), plus the timed and settling steps."""
        if self.seconds is not None and size == "full":
            return self.seconds
        c = dict(COMPILE_S[size])
        if self.compile_s is not None and size == "full":
            c["jax"] = self.compile_s
        argv = self.argv
        if argv[0] == "dispatch":
            workloads = len(_value(argv, "--workload").split(",")) if "--workload" in argv else 4
            rounds = int(_value(argv, "--rounds") or 100)
            budget = float(_value(argv, "--budget") or 0.01)
            return c["entry"] + workloads * (c["dispatch"] + DISPATCH_ROWS * rounds * 2 * budget)
        impl = _value(argv, "--impl") or "all"
        impls = IMPLS if impl == "all" else tuple(impl.split(","))
        n_jax = sum(1 for i in impls if i in JAX_IMPLS)
        if _value(argv, "--mode") in ("prefill", "decode"):
            # Each JAX library's timed generation styles (`--call`: the fastest by default)
            # compile a whole generate of 1, of `base_tokens(new)` and of `new` tokens; every
            # style (and PyTorch's two) runs `repeat` generates of each.
            new = int(_value(argv, "--new-tokens") or 32)
            lengths = {1, base_tokens(new), new}
            repeat = int(_value(argv, "--repeat") or 3)
            per_lib = len(generation_styles(_value(argv, "--call") or "default"))
            styles = per_lib * n_jax + 2 * ("torch" in impls)
            generate = c["jax"] if self.compile_s is not None and size == "full" else (
                c["generate"])
            return (c["entry"] + per_lib * n_jax * len(lengths) * generate
                    + styles * repeat * sum(lengths) * c["step"])
        modes = 1 if _value(argv, "--mode") in ("forward", "train") else 2
        method = _value(argv, "--method")
        methods = len(CHOICES) if method == "all" else max(1, len(method.split(",")))
        call = _value(argv, "--call") or "default"
        per_lib = (JAX_STYLES_ALL / len(JAX_IMPLS) if call == "all" else
                   1 if call == "default" else len(call.split(",")))
        jax_styles = methods * n_jax * per_lib
        # The fairness check compiles the fast path strictly (full float32), then again at the
        # timed precision where that computes in another format (float32 on a GPU: TF32), or
        # only at the timed precision (`--check timed`); the fast style reuses the last pass's
        # program, every other style compiles its own.
        passes = 2 if (size == "full" and _value(argv, "--dtype") != "bfloat16"
                       and _value(argv, "--precision") != "highest"
                       and _value(argv, "--check") != "timed") else 1
        jax_compiles = modes * methods * n_jax * (per_lib - 1 + passes)
        torch_compiled = "--torch-compile" in argv and "torch" in impls
        if self.compile_s is not None and size == "full":  # Inductor slows down alike
            c["torch_compile"] *= self.compile_s / COMPILE_S["full"]["jax"]
        torch_styles = ("torch" in impls) + torch_compiled
        rounds = int(_value(argv, "--rounds") or 5)
        settle = float(_value(argv, "--settle") or 50) / 1e3
        steps = int(_value(argv, "--warmup") or 3) + int(_value(argv, "--repeat") or 20)
        timing = modes * (jax_styles + torch_styles) * (rounds * settle + steps * c["step"])
        return (c["entry"] + jax_compiles * c["jax"] + modes * torch_compiled * c["torch_compile"]
                + timing)


def _value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv else ""


@dataclass(frozen=True)
class Slot:
    """An entry of a budgeted run: its part and the clock time by which it must end (None: no
    limit)."""

    entry: Entry
    part: str
    deadline: float | None


@dataclass
class Outcome:
    """What a budgeted run did: entries run (the form run), skipped (with the reason) and the
    problems (one line each)."""

    ran: list[Entry] = dataclasses.field(default_factory=list)
    skipped: list[tuple[Entry, str]] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)


def fmt_left(seconds: float) -> str:
    """Seconds as m:ss (negative: 0:00)."""
    s = max(0, round(seconds))
    return f"{s // 60}:{s % 60:02d}"


class Schedule:
    """Picks, at the time an entry would start, what runs: an entry that ends by its deadline
    by its estimate; for an entry with other forms (`Entry.forms`: a fallback, smaller cuts),
    the first form that fits with the cheapest form of every later entry of its part still
    fitting after it (extras such as torch.compile come after the essentials), else the first
    cheaper form that fits alone; otherwise nothing: the entry is skipped (and says so), never
    started late. Estimates: the measured time of the same command (`measured`, from earlier
    records on this device), else `Entry.estimate_s(size)`."""

    def __init__(self, slots: list[Slot], size: str,
                 measured: dict[str, float] | None = None) -> None:
        self.slots, self.size, self.measured = slots, size, measured or {}

    def estimate(self, entry: Entry) -> float:
        return self.measured.get(entry.command) or entry.estimate_s(self.size)

    def cheapest(self, entry: Entry) -> float:
        return min(self.estimate(form) for form in entry.forms())

    def pick(self, i: int, now: float) -> tuple[Entry | None, str]:
        """(what to run for slot `i` at `now`, why not the entry itself): the entry, one of
        its cheaper forms or None."""
        slot = self.slots[i]
        if slot.deadline is None:
            return slot.entry, ""
        forms = slot.entry.forms()
        reserve = 0.0
        if len(forms) > 1:
            reserve = sum(self.cheapest(s.entry) for s in self.slots[i + 1:]
                          if s.part == slot.part and s.deadline == slot.deadline)
        fits = [f for f in forms if now + self.estimate(f) + reserve <= slot.deadline] or [
            f for f in forms[1:] if now + self.estimate(f) <= slot.deadline]
        if not fits:
            return None, (f"estimated {self.estimate(forms[-1]):.0f} s, "
                          f"{max(0.0, slot.deadline - now):.0f} s left in part {slot.part}")
        if fits[0] is forms[0]:
            return fits[0], ""
        return fits[0], cut_reason(forms[0], fits[0], self.estimate(forms[0]))


def cut_reason(entry: Entry, form: Entry, estimate: float) -> str:
    """Why `form` runs instead of `entry`: an extra dropped, or a cut to a smaller shape."""
    full, cut = arguments(entry.argv), arguments(form.argv)
    added = " ".join(p for p in cut if p not in full)
    if not added:
        return f"no time for {' '.join(p for p in full if p not in cut) or '(nothing)'}"
    return f"cut to {added} (the full form: estimated {estimate:.0f} s)"


def arguments(argv: tuple[str, ...]) -> list[str]:
    """`argv` as its arguments: each flag with its value ("--mode forward"), or alone."""
    out: list[str] = []
    for a in argv:
        if out and out[-1].startswith("--") and " " not in out[-1] and not a.startswith("--"):
            out[-1] += f" {a}"
        else:
            out.append(a)
    return out


def _dropped(argv: tuple[str, ...], fallback: tuple[str, ...]) -> str:
    return " ".join(a for a in argv if a not in fallback) or "(nothing)"


def run_slots(slots: list[Slot], run_one: Any, console: Any, *, size: str,
              clock: Any = time.time, end: float | None = None,
              measured: dict[str, float] | None = None, keep_going: bool = False,
              on_event: Any = None, first: int = 0) -> Outcome:
    """Run the slots in order, each as `Schedule.pick` says, printing the time left before
    each. `run_one(entry)` returns a problem (one line) or None; with `keep_going`, an
    exception is a problem too. `end`: the run's overall end (for the time left).
    `on_event(i, event, entry[, problem])`: "start", "end" (with the problem) or "skip" per
    slot. `first`: the slots before it are left out (a resumed run)."""
    schedule = Schedule(slots, size, measured)
    outcome = Outcome()
    start = clock()
    for i in range(first, len(slots)):
        slot = slots[i]
        now = clock()
        entry, why = schedule.pick(i, now)
        if entry is None:
            outcome.skipped.append((slot.entry, why))
            console.print(f"[yellow]skipped ({why}): {slot.entry.command}[/]")
            if on_event:
                on_event(i, "skip", slot.entry)
            continue
        left = [] if end is not None else [f"{now - start:.0f} s"]
        if end is not None:
            left.append(f"{fmt_left(end - now)} left")
        if slot.deadline is not None and slot.deadline != end:
            left.append(f"{slot.part} {fmt_left(slot.deadline - now)}")
        console.print(f"[bold]({i + 1}/{len(slots)}, {', '.join(left)}) {entry.command}[/]")
        if why:
            console.print(f"[yellow]{why}[/]")
            outcome.skipped.append((slot.entry, why))
        if on_event:
            on_event(i, "start", entry)
        try:
            problem = run_one(entry)
        except Exception as e:
            if not keep_going:
                raise
            problem = f"{entry.command}: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        if problem:
            outcome.problems.append(problem)
            console.print(f"[bold red]{problem}[/]")
        outcome.ran.append(entry)
        if on_event:
            on_event(i, "end", entry, problem)
    return outcome


def print_skipped(outcome: Outcome, out: str, console: Any) -> None:
    """The command that runs each skipped entry (or the dropped part of a fallback) alone."""
    for entry, why in outcome.skipped:
        console.print(f"[yellow]skipped ({why}); run it alone: {entry.command} --record "
                      f"--results-dir {out}[/]")


def plan(quick: bool, repeat: int) -> list[Entry]:
    """The matrix's entries, most wanted first. `quick`: the same kinds of entry on the tiny
    presets, one method where the full matrix has all (except the single layer's forward), no
    `torch.compile`, Equinox and PyTorch only (every library on the tiny presets is the test
    suite's job)."""
    timing = ("--repeat", str(repeat), "--warmup", "1" if quick else "3",
              "--rounds", "1" if quick else "5", "--settle", "0" if quick else "50",
              "--no-progress")
    compile_ = () if quick else ("--torch-compile",)
    preset = (lambda name: ("--preset", "tiny")) if quick else (lambda name: ("--preset", name))
    # Quick: the formulation XLA:CPU compiles fastest (CI time).
    methods = ("--method", "lhs_dilation") if quick else ("--method", "all")
    impls = ("--impl", "eqx,torch" if zoo.list_implementations("torch") else "eqx") if quick else (
        "--impl", "all")
    runs = [(arch, run) for arch in bench_archs() for run in bench_spec(arch).matrix
            if not (quick and run.realistic)]

    def declared(arch: str, run: MatrixRun) -> Entry:
        return Entry(run.group, (arch, *preset(run.preset), *run.args,
                                 *(methods if run.methods else ()), *impls, *compile_, *timing))

    entries = [declared(arch, run) for arch, run in runs if not run.realistic]
    entries.append(Entry("dispatch", ("dispatch", "--impl", "all", "--no-progress",
                                      *(("--workload", "identity", "--rounds", "2", "--budget",
                                         "0.001") if quick else ("--rounds", "50")))))
    size = ("--preset", "tiny") if quick else ()
    calls = ("--call", "default") if quick else ("--call", "all")
    for dtype in ("float32", "bfloat16"):
        for arch in zoo.ARCHS:
            mode = ("--mode", "forward" if quick and dtype != "float32" else "both")
            entries.append(Entry("models", (arch, *size, *mode, "--dtype", dtype, *impls,
                                            *calls, *(methods if quick else ()), *compile_,
                                            *timing)))
    entries += [declared(arch, run) for arch, run in runs if run.realistic]
    return entries


def run_entry(entry: Entry, out: str, console: Any, allocator: dict[str, Any],
              extra: dict[str, Any] | None = None) -> str | None:
    """Run one entry in this process and write its record (with `extra` fields and the entry's
    wall time, `wall_s`); returns a problem or None."""
    from zoo.bench.dispatch import WORKLOADS, run_dispatch
    from zoo.bench.runner import run

    start = time.perf_counter()
    path = None
    # Every entry runs at the precision its command names, and its record says which.
    precision = _value(entry.argv, "--precision") or "default"
    if entry.argv[0] == "dispatch":
        argv = entry.argv
        workloads = tuple(_value(argv, "--workload").split(",")) if "--workload" in argv else (
            tuple(WORKLOADS))
        with policy.use(precision):
            record = run_dispatch(parse_impls(_value(argv, "--impl")),
                                  int(_value(argv, "--rounds")),
                                  float(_value(argv, "--budget") or 0.01), workloads, console,
                                  progress=False, tiny="--tiny" in argv)
        record["precision"] = precision
    elif _value(entry.argv, "--mode") in ("prefill", "decode"):  # zoo.bench.generation
        from zoo.bench.generation import run_from_args, run_generation, table

        run_ = run_from_args(bench_parser().parse_args(list(entry.argv)))
        try:
            with policy.use(precision):
                record = run_generation(run_)
        except FairnessError as e:
            return f"{entry.command}: {e}"
        record["precision"] = precision
        for line in table(record):
            console.print(line, highlight=False, soft_wrap=True)
        path = run_.name
    else:
        cfg = config_from_args(bench_parser().parse_args(list(entry.argv)))
        try:
            record = run(cfg, console=console, progress=False)
        except FairnessError as e:
            return f"{entry.command}: {e}"
        print_model_record(record, console)
    record["allocator"] = allocator
    record["command"] = entry.command
    record["wall_s"] = time.perf_counter() - start
    record.update(extra or {})
    if path is None:
        save(record, None, out, console)
    else:
        path = os.path.join(out, record["device"]["slug"], path)
        write_json(record, path)
        console.print(f"wrote {path}")
    return None


def measured_times(directory: str) -> dict[str, float]:
    """command -> the whole time of its newest run (`wall_s`), from the records in
    `directory` (this device's): the estimate a rerun budgets with."""
    import glob
    import json
    import os

    times: dict[str, tuple[str, float]] = {}
    for path in glob.glob(os.path.join(directory, "*.json")):
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or not record.get("wall_s") or not record.get("command"):
            continue
        stamp = record.get("timestamp") or ""
        if record["command"] not in times or stamp > times[record["command"]][0]:
            times[record["command"]] = (stamp, float(record["wall_s"]))
    return {command: wall for command, (_, wall) in times.items()}


def matrix_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m zoo.bench matrix", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, metavar="DIR",
                   help="records go to DIR/<device>/ (bench/results for the committed ones)")
    p.add_argument("--quick", action="store_true",
                   help="tiny presets, no torch.compile, 2 timed steps (CPU CI)")
    p.add_argument("--repeat", type=positive_int, default=None,
                   help="timed steps per call style (default 2 quick, 20 full)")
    p.add_argument("--budget-min", type=positive_float, default=None,
                   help="skip entries that would end after this many minutes (default 9; "
                        "none with --quick)")
    p.add_argument("--only", default=None,
                   help="comma list of groups: dispatch, models and those the subjects declare "
                        "(convt, decoder, presets)")
    p.add_argument("--subjects", default=None, metavar="NAMES",
                   help="comma list of subjects whose entries run (architectures and "
                        "bench-only subjects such as convt; default every one)")
    args = p.parse_args(argv)
    allocator = configure_allocator(torch_in_process=True)
    console = make_console()
    size = "quick" if args.quick else "full"
    entries = plan(args.quick, args.repeat or (2 if args.quick else 20))
    if args.only:
        groups = {g.strip() for g in args.only.split(",")}
        unknown = groups - {e.group for e in entries}
        if unknown:
            p.error(f"--only: unknown group(s) {sorted(unknown)}")
        entries = [e for e in entries if e.group in groups]
    if args.subjects:
        subjects = {s.strip() for s in args.subjects.split(",")}
        unknown = subjects - set(bench_archs())
        if unknown:
            p.error(f"--subjects: unknown subject(s) {sorted(unknown)}; the subjects: "
                    + ", ".join(bench_archs()))
        entries = [e for e in entries if e.argv[0] not in bench_archs() or e.argv[0] in subjects]
    budget = (args.budget_min if args.budget_min is not None
              else None if args.quick else 9.0)
    total = sum(e.estimate_s(size) for e in entries)
    console.print(f"matrix: {len(entries)} entries, estimated {total / 60:.1f} min "
                  f"(compilations dominate){f'; budget {budget:g} min' if budget else ''}")
    start = time.time()
    end = start + budget * 60 if budget else None
    slots = [Slot(e, "matrix", end) for e in entries]
    outcome = run_slots(slots, lambda e: run_entry(e, args.out, console, allocator), console,
                        size=size, end=end)
    console.print(f"matrix done in {time.time() - start:.0f} s; records in {args.out}/; "
                  f"render with: python -m zoo.bench report --results {args.out}")
    print_skipped(outcome, args.out, console)
    return 3 if outcome.problems else 0
