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
`torch.compile` (CPU CI).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import zoo
from zoo.bench.spec import MatrixRun, bench_archs, bench_spec
from zoo.cli import ArgumentParser, positive_float, positive_int

# Rough seconds per compilation, for the printed estimate and the budget: guesses for an H100
# host (XLA autotunes convolutions; torch.compile runs Inductor) until GPU records give the
# measured compile times (`compile` in every result row). Timed steps are cheap next to them.
COMPILE_S = {"quick": {"jax": 0.6, "torch_compile": 0.0, "entry": 1.0},
             "full": {"jax": 1.5, "torch_compile": 15.0, "entry": 3.0}}
JAX_STYLES_ALL = 10  # call styles of the three JAX libraries with --call all


@dataclass(frozen=True)
class Entry:
    """One command of the matrix: `argv` for `python -m zoo.bench`."""

    group: str
    argv: tuple[str, ...]

    @property
    def command(self) -> str:
        return "python -m zoo.bench " + " ".join(self.argv)

    def estimate_s(self, size: str) -> float:
        """Compilations x their rough cost (`COMPILE_S`)."""
        c = COMPILE_S[size]
        if self.group == "dispatch":
            return c["entry"] * 10
        argv = self.argv
        modes = 2 if "both" in argv else 1
        methods = 4 if "all" in _value(argv, "--method") else 1
        styles = JAX_STYLES_ALL if _value(argv, "--call") == "all" else 3
        jax_compiles = modes * methods * (styles + 3 * 2)  # + the fairness passes
        torch = modes if "--torch-compile" in argv else 0
        return c["entry"] + jax_compiles * c["jax"] + torch * c["torch_compile"]


def _value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv else ""


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


def run_entry(entry: Entry, out: str, console: Any, allocator: dict[str, Any]) -> str | None:
    """Run one entry in this process and write its record; returns a problem or None."""
    from zoo.bench.dispatch import WORKLOADS, run_dispatch
    from zoo.bench.fairness import FairnessError
    from zoo.bench.options import bench_parser, config_from_args, parse_impls
    from zoo.bench.records import save
    from zoo.bench.runner import run
    from zoo.bench.tables import print_model_record

    if entry.group == "dispatch":
        argv = entry.argv
        workloads = tuple(_value(argv, "--workload").split(",")) if "--workload" in argv else (
            tuple(WORKLOADS))
        record = run_dispatch(parse_impls(_value(argv, "--impl")), int(_value(argv, "--rounds")),
                              float(_value(argv, "--budget") or 0.01), workloads, console,
                              progress=False)
    else:
        cfg = config_from_args(bench_parser().parse_args(list(entry.argv)))
        try:
            record = run(cfg, console=console, progress=False)
        except FairnessError as e:
            return f"{entry.command}: {e}"
        print_model_record(record, console)
    record["allocator"] = allocator
    record["command"] = entry.command
    save(record, None, out, console)
    return None


def matrix_main(argv: list[str]) -> int:
    from zoo.bench.accel import configure_allocator
    from zoo.bench.display import make_console

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
    budget = (args.budget_min if args.budget_min is not None
              else None if args.quick else 9.0)
    total = sum(e.estimate_s(size) for e in entries)
    console.print(f"matrix: {len(entries)} entries, estimated {total / 60:.1f} min "
                  f"(compilations dominate){f'; budget {budget:g} min' if budget else ''}")
    start = time.perf_counter()
    problems, skipped = [], []
    for i, entry in enumerate(entries, 1):
        elapsed = time.perf_counter() - start
        if budget and elapsed + entry.estimate_s(size) > budget * 60:
            skipped.append(entry)
            continue
        console.print(f"[bold]({i}/{len(entries)}, {elapsed:.0f} s) {entry.command}[/]")
        problem = run_entry(entry, args.out, console, allocator)
        if problem:
            problems.append(problem)
            console.print(f"[bold red]{problem}[/]")
    console.print(f"matrix done in {time.perf_counter() - start:.0f} s; records in {args.out}/; "
                  f"render with: python -m zoo.bench report --results {args.out}")
    for entry in skipped:
        console.print(f"[yellow]skipped (budget), run it alone: {entry.command} --record "
                      f"--results-dir {args.out}[/]")
    return 3 if problems else 0
