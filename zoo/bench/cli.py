"""`python -m zoo.bench`: the command line (see `--help` and docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from zoo import precision as policy
from zoo.bench.display import make_console
from zoo.bench.options import parse_impls, resolve_calls
from zoo.bench.presets import ARCHS, DEFAULT_BATCH, LAYER_ARCH, PRESETS, PresetError, find_preset
from zoo.bench.records import RESULTS_DIR, save
from zoo.layers.conv_transpose import METHODS

EXIT_UNFAIR = 3

USAGE_EPILOG = """\
other commands:
  python -m zoo.bench dispatch [--impl ...] [--json PATH] [--record]   per-call overhead suite
  python -m zoo.bench report [--results DIR]     render bench/README.md and bench/plots/
  python -m zoo.bench matrix --out DIR [--quick]  every architecture, library, mode, dtype, style
  python -m zoo.bench presets                    list the named shapes

call styles (--call): eqx: filter_jit, partition, fast; linen: jit, fast;
  nnx: nnx_jit, cached_partial, jit_partial, split, fast; torch: eager, compile.
  "default" = each library's fastest (fast, torch eager); "all" = every style installed.
exit status: 0 ok, 2 bad arguments, 3 fairness check failed (nothing timed).
"""


def bench_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m zoo.bench", description="Fair benchmarks of the zoo's models in "
        "Equinox, Flax Linen, Flax NNX and PyTorch (same weights, checked before timing).",
        epilog=USAGE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("arch", nargs="?", choices=ARCHS,
                   help=f"architecture ({LAYER_ARCH!r} = one 3-D conv-transpose layer); "
                        "may be omitted when --preset names a unique shape")
    p.add_argument("--impl", default="all", help="all or a comma list of eqx,linen,nnx,torch")
    p.add_argument("--mode", choices=("forward", "train", "both"), default=None,
                   help="forward (inference), train (loss, gradients, optax update, BN state) "
                        "or both (default: the preset's modes, else both)")
    p.add_argument("--call", default="default",
                   help="default | all | comma list of call styles (see below)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    p.add_argument("--preset", default=None, help="named shape (python -m zoo.bench presets)")
    p.add_argument("--config", default=None, metavar="JSON",
                   help='config overrides, e.g. \'{"hidden": [1024, 1024]}\'')
    p.add_argument("--method", default="auto",
                   help=f"conv-transpose formulation (Decoder3D conv_method, convt layers): "
                        f"{', '.join((*METHODS, 'auto'))}, a comma list, or all (every method "
                        "side by side in one run, with a x lhs_dilation column)")
    p.add_argument("--precision", choices=policy.PRECISIONS, default="default",
                   help="float32 matmul/conv precision timed: default (the libraries' own: TF32 "
                        "on recent GPUs), high, highest (full float32); outputs are first "
                        "checked strictly at highest, then at this precision")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20, help="timed steps per call style")
    p.add_argument("--rounds", type=int, default=5,
                   help="the timed steps run in this many rounds, interleaved across styles")
    p.add_argument("--json", default=None, metavar="PATH", help="write the run's JSON record")
    p.add_argument("--record", action="store_true",
                   help=f"also write it to {RESULTS_DIR}/<device>/<name>.json")
    p.add_argument("--results-dir", default=RESULTS_DIR, help=argparse.SUPPRESS)
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="jax.profiler trace of a few extra steps per style (Perfetto)")
    p.add_argument("--torch-compile", action="store_true", help="add the torch.compile style")
    p.add_argument("--torch-threads", type=int, default=None, metavar="N",
                   help="torch.set_num_threads(N) (default: PyTorch's own choice)")
    p.add_argument("--no-progress", action="store_true")
    return p


def config_from_args(args: argparse.Namespace) -> Any:
    from zoo.bench.runner import BenchConfig, parse_methods

    preset = find_preset(args.preset, args.arch) if args.preset else None
    arch = preset.arch if preset else args.arch
    if arch is None:
        raise PresetError("name an architecture or a preset")
    overrides = dict(preset.config) if preset else {}
    if args.config:
        overrides.update(json.loads(args.config))
    if args.mode is not None:
        modes = ("forward", "train") if args.mode == "both" else (args.mode,)
    else:
        modes = preset.modes if preset else ("forward", "train")
    impls = parse_impls(args.impl)
    parse_methods(args.method)  # ValueError -> exit 2
    return BenchConfig(
        arch=arch, impls=impls,
        calls=resolve_calls(args.call, impls, torch_compile=args.torch_compile),
        modes=tuple(modes), batch=args.batch or (preset.batch if preset else DEFAULT_BATCH[arch]),
        dtype=args.dtype or (preset.dtype if preset else "float32"), model_config=overrides,
        preset=preset.name if preset else None, method=args.method, warmup=args.warmup,
        repeat=args.repeat, rounds=args.rounds, seed=args.seed, torch_compile=args.torch_compile,
        torch_threads=args.torch_threads, profile=args.profile, precision=args.precision)


def bench_main(argv: list[str]) -> int:
    from rich.console import Console

    from zoo.bench.accel import configure_allocator
    from zoo.bench.fairness import FairnessError
    from zoo.bench.runner import run
    from zoo.bench.tables import print_model_record

    parser = bench_parser()
    args = parser.parse_args(argv)
    console = make_console()
    try:
        cfg = config_from_args(args)
    except (PresetError, ValueError, argparse.ArgumentTypeError) as e:
        parser.error(str(e))
    allocator = configure_allocator("torch" in cfg.impls)
    try:
        record = run(cfg, console=console, progress=not args.no_progress)
    except FairnessError as e:
        Console(stderr=True).print(f"[bold red]zoo.bench: {e}[/]", highlight=False)
        return EXIT_UNFAIR
    record["allocator"] = allocator
    print_model_record(record, console)
    save(record, args.json, args.results_dir if args.record else None, console)
    return 0


def presets_main(argv: list[str]) -> int:
    from rich.table import Table

    table = Table(title="presets (python -m zoo.bench ARCH --preset NAME)", title_justify="left")
    for col in ("arch", "name", "batch", "dtype", "modes", "shape"):
        table.add_column(col)
    for p in PRESETS:
        table.add_row(p.arch, p.name, str(p.batch), p.dtype, ",".join(p.modes), p.doc)
    make_console().print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "dispatch":
        from zoo.bench.dispatch import dispatch_main

        return dispatch_main(argv[1:])
    if argv and argv[0] == "report":
        from zoo.bench.report import report_main

        return report_main(argv[1:])
    if argv and argv[0] == "presets":
        return presets_main(argv[1:])
    if argv and argv[0] == "matrix":
        from zoo.bench.matrix import matrix_main

        return matrix_main(argv[1:])
    return bench_main(argv)
