"""`python -m zoo.bench`: the command line (see `--help` and docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import importlib
import math
import sys

from zoo.arguments import ArgumentParser
from zoo.bench.accel import configure_allocator
from zoo.bench.display import make_console
from zoo.bench.fairness import FairnessError
from zoo.bench.mesh import MeshError, parse_mesh, request_devices
from zoo.bench.options import bench_parser, config_from_args
from zoo.bench.presets import PRESETS, PresetError
from zoo.bench.records import save
from zoo.bench.tables import print_model_record
from zoo.bench.xla_flags import apply as apply_xla_flags
from zoo.runtime.malloc import keep_freed_memory

EXIT_UNFAIR = 3
__all__ = ["EXIT_UNFAIR", "bench_parser", "config_from_args", "main"]


def bench_main(argv: list[str]) -> int:
    from rich.console import Console

    from zoo.bench.runner import run

    parser = bench_parser()
    args = parser.parse_args(argv)
    console = make_console(args.wide)
    if args.mode in ("prefill", "decode"):  # language models' generation (zoo.generate)
        from zoo.bench.generation import generation_main, run_from_args

        try:
            run = run_from_args(args)
        except (PresetError, ValueError, argparse.ArgumentTypeError) as e:
            parser.error(str(e))
        return generation_main(run, args, console)
    xla_flags = None
    # before JAX's and PyTorch's worker threads start (each takes its arena when it starts)
    malloc = keep_freed_memory() if args.malloc == "keep" else {"applied": False,
                                                                "reason": "glibc's defaults"}
    try:
        if args.xla_cpu_flags is not None:  # before any JAX computation starts the backend
            xla_flags = apply_xla_flags(args.xla_cpu_flags)
        if args.mesh is not None:  # host devices for the mesh, before the backend starts
            request_devices(math.prod(parse_mesh(args.mesh)))
        cfg = config_from_args(args)
    except (PresetError, ValueError, argparse.ArgumentTypeError) as e:
        parser.error(str(e))
    allocator = configure_allocator("torch" in cfg.impls)
    try:
        record = run(cfg, console=console, progress=not args.no_progress)
    except MeshError as e:
        parser.error(str(e))
    except FairnessError as e:
        Console(stderr=True).print(f"[bold red]zoo.bench: {e}[/]", highlight=False)
        return EXIT_UNFAIR
    record["allocator"] = allocator
    record["malloc"] = malloc
    record["config"]["xla_flags"] = xla_flags
    asked = frozenset(c.strip() for c in args.call.split(","))
    print_model_record(record, console, wide=args.wide, asked=asked)
    save(record, args.json, args.results_dir if args.record else None, console)
    if args.plot:
        from zoo.bench.report import plot_record

        plot_record(record, args.plot)
        console.print(f"wrote {args.plot}")
    else:
        console.print("picture: add --plot PNG; more columns: --wide; records: --json PATH "
                      "(python -m zoo.bench report renders them)", style="dim", highlight=False)
    return 0


def presets_main(argv: list[str]) -> int:
    from rich.table import Table
    from rich.text import Text

    ArgumentParser(prog="python -m zoo.bench presets",
                   description="the named shapes of every subject").parse_args(argv)
    table = Table(title="presets: python -m zoo.bench ARCH --preset NAME", title_justify="left",
                  expand=True)
    table.add_column("arch", no_wrap=True)
    table.add_column("name", no_wrap=True)
    table.add_column("batch", justify="right", no_wrap=True)
    table.add_column("description (float32, forward + train unless said)", ratio=1,
                     overflow="fold")  # a long model name folds, never cut
    for p in PRESETS:
        notes = [n for n in (p.dtype if p.dtype != "float32" else "",
                             " + ".join(p.modes) + " only" if set(p.modes) != {"forward", "train"}
                             else "") if n]
        table.add_row(p.arch, p.name, str(p.batch),
                      Text(p.doc + (f"; {', '.join(notes)}" if notes else "")))
    make_console().print(table)
    return 0


# The subcommands, each "module:function" taking the rest of the command line, imported when
# run (a subcommand's start-up pays for its own imports only); anything else is a subject.
SUBCOMMANDS: dict[str, str] = {
    "dispatch": "zoo.bench.dispatch:dispatch_main",
    "report": "zoo.bench.report:report_main",
    "presets": "zoo.bench.cli:presets_main",
    "xla-flags": "zoo.bench.xla_flags:xla_flags_main",
    "convert": "zoo.bench.convert:convert_main",
    "breakdown": "zoo.bench.investigations.breakdown:breakdown_main",
    "xla-cpu": "zoo.bench.investigations.xla_cpu:xla_cpu_main",
    "gpu": "zoo.bench.gpu:gpu_main",
    "matrix": "zoo.bench.matrix:matrix_main",
    "partition": "zoo.bench.partition:partition_main",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        module, _, function = SUBCOMMANDS[argv[0]].partition(":")
        return getattr(importlib.import_module(module), function)(argv[1:])
    return bench_main(argv)
