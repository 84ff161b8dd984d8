"""The model benchmark's command-line options: the parser, and argument values -> validated
choices (implementations, call styles) -> a `BenchConfig`. Shared by `python -m zoo.bench` and
`python -m zoo.bench matrix`."""

from __future__ import annotations

import argparse
import json
from typing import Any

import zoo
from zoo.arguments import (
    ArgumentParser,
    non_negative_float,
    non_negative_int,
    positive_int,
)
from zoo.bench.mesh import MeshError, parse_mesh
from zoo.bench.presets import ARCHS, DEFAULT_BATCH, PresetError, find_preset
from zoo.bench.records import RESULTS_DIR
from zoo.bench.runner import BenchConfig, parse_methods
from zoo.bench.styles import available_styles, benched, default_style, idiomatic_style
from zoo.layers.conv_transpose import METHODS
from zoo.libraries import library
from zoo.runtime import precision as policy
from zoo.runtime.sharding import STRATEGIES

USAGE_EPILOG = """\
other commands (python -m zoo.bench COMMAND --help):
  dispatch [--impl ...] [--json PATH]  per-call overhead suite
  report [--results DIR]               render bench/README.md and bench/plots/
  matrix --out DIR [--quick]           every architecture, library, mode, dtype
  gpu [--dry-run]                      everything a GPU measures, in 9 minutes
  presets                              list the named shapes
  xla-flags                            XLA:CPU flag presets, probed on this XLA
  breakdown ARCH --preset P            step time per op category
  xla-cpu [--only NAME,...]            XLA:CPU's limits, minimal reproductions
  convert                              checkpoint conversion, every format pair
  partition [--layers N]               frozen / trainable split: cost per step

call styles (--call): eqx: filter_jit, partition, fast; linen: jit, fast;
  nnx: nnx_jit, jit_tree, flaxlib, cached_partial, jit_partial, split, fast;
  torch: eager, compile; fused (every JAX library, with --steps-per-call K).
  "default" = each library's fastest (fast, torch eager); "idiomatic" = its
  documented way (filter_jit, jit, nnx_jit, eager), also in a comma list;
  "all" = every style installed.
exit status: 0 ok, 2 bad arguments, 3 fairness check failed (nothing timed).
"""


def parse_impls(value: str) -> tuple[str, ...]:
    """`all` (PyTorch only if installed) or a comma list of implementations."""
    available = tuple(i for i in zoo.IMPLS if i in {i for _, i in zoo.list_implementations()})
    if value == "all":
        return available
    impls = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [i for i in impls if i not in zoo.IMPLS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown impl {bad}; choose from all, {zoo.IMPLS}")
    missing = [i for i in impls if i not in available]
    if missing:
        raise argparse.ArgumentTypeError(f"{missing} not installed (PyTorch missing?)")
    return impls



def resolve_calls(value: str, impls: tuple[str, ...], *, torch_compile: bool = False,
                  steps_per_call: int = 1) -> dict[str, list[str]]:
    """--call value -> impl -> styles. Names a library lacks are skipped for that library;
    in a comma list, "default" and "idiomatic" name each library's own (`--call
    default,idiomatic`: the fastest and the documented way side by side).
    With `steps_per_call` > 1, every JAX library also gets the "fused" style."""

    out: dict[str, list[str]] = {}
    wanted = [v.strip() for v in value.split(",") if v.strip()]
    fused = steps_per_call > 1
    for impl in impls:
        avail = available_styles(impl, torch_compile=torch_compile, fused=fused)
        if value == "all":
            calls = avail
        elif value == "default":
            calls = [default_style(impl)]
            if torch_compile and "compile" in benched(impl).styles:
                calls.append("compile")
        else:  # names; "default" and "idiomatic" stand for the library's own
            names = [default_style(impl) if c == "default" else
                     idiomatic_style(impl) if c == "idiomatic" else c for c in wanted]
            calls = list(dict.fromkeys(c for c in names if c in avail))
            if torch_compile and "compile" in benched(impl).styles and "compile" not in calls:
                calls.append("compile")
        if fused and "fused" in avail and "fused" not in calls:
            calls.append("fused")
        if not calls:
            raise ValueError(f"no call style {wanted} for {impl}; it has {avail}")
        out[impl] = calls
    return out


def bench_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m zoo.bench",
        description="Fair benchmarks of the zoo's models in Equinox, Flax Linen, Flax NNX\n"
                    "and PyTorch (same weights, checked before timing).",
        epilog=USAGE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("arch", nargs="?", choices=ARCHS, metavar="ARCH",
                   help="architecture or bench-only subject (python -m zoo.bench presets: "
                        f"{', '.join(ARCHS)}); may be omitted when --preset names a unique "
                        "shape")
    p.add_argument("--impl", default="all", help="all or a comma list of eqx,linen,nnx,torch")
    p.add_argument("--mode", choices=("forward", "train", "both", "prefill", "decode"),
                   default=None,
                   help="forward (inference), train (loss, gradients, optax update, BN state) "
                        "or both (default: the preset's modes, else both); language models: "
                        "prefill or decode (zoo.generate: both are timed, batch 1 unless "
                        "--batch)")
    p.add_argument("--prompt", type=positive_int, default=None,
                   help="prefill/decode: the prompt's tokens (default 32, at most half the "
                        "model's positions)")
    p.add_argument("--new-tokens", type=positive_int, default=None,
                   help="prefill/decode: greedy tokens generated (default 32, at most the "
                        "positions the prompt leaves)")
    p.add_argument("--no-transformers", action="store_true",
                   help="prefill/decode: leave transformers' generate out")
    p.add_argument("--call", default="default",
                   help="default | idiomatic | all | comma list of call styles (see below)")
    p.add_argument("--batch", type=positive_int, default=None)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    p.add_argument("--preset", default=None, help="named shape (python -m zoo.bench presets)")
    p.add_argument("--config", default=None, metavar="JSON",
                   help='config overrides, e.g. \'{"hidden": [1024, 1024]}\'')
    p.add_argument("--method", default="auto",
                   help=f"conv-transpose formulation (of the subjects that have conv-transposes): "
                        f"{', '.join((*METHODS, 'auto'))}, a comma list, or all (every method "
                        "side by side in one run, with a x lhs_dilation column)")
    p.add_argument("--precision", choices=policy.PRECISIONS, default="default",
                   help="float32 matmul/conv precision timed: default (the libraries' own: TF32 "
                        "on recent GPUs), high, highest (full float32); outputs are first "
                        "checked strictly at highest, then at this precision")
    p.add_argument("--check", choices=("strict", "timed"), default="strict",
                   help="fairness passes: strict (at highest, then at --precision) or timed "
                        "(at --precision only: one compilation per program, the GPU run's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=non_negative_int, default=3)
    p.add_argument("--repeat", type=positive_int, default=None,
                   help="timed steps per call style (default 20; prefill/decode: generations, "
                        "default 3)")
    p.add_argument("--rounds", type=positive_int, default=5,
                   help="the timed steps run in this many rounds, interleaved across styles")
    p.add_argument("--settle", type=non_negative_float, default=50.0, metavar="MS",
                   help="untimed calls of a style for this long before each of its rounds, so "
                        "that it is timed in its steady state, not in the wake of the style "
                        "before it (default 50)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the run's JSON record")
    p.add_argument("--record", action="store_true",
                   help=f"also write it to {RESULTS_DIR}/<device>/<name>.json")
    p.add_argument("--results-dir", default=RESULTS_DIR, help=argparse.SUPPRESS)
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="jax.profiler trace of a few extra steps per style (Perfetto)")
    p.add_argument("--steps-per-call", type=positive_int, default=1, metavar="K",
                   help="K > 1 adds the 'fused' style to every JAX library: zoo.runtime.fast "
                        "with K training steps (forward: K batches) per call, in one lax.scan; "
                        "all times are per step")
    p.add_argument("--xla-cpu-flags", default=None, metavar="PRESET|FLAGS",
                   help="XLA:CPU flags set before JAX starts (recorded): a preset "
                        "(python -m zoo.bench xla-flags) or a string of --xla_cpu_* flags")
    p.add_argument("--malloc", choices=("system", "keep"), default="system",
                   help="keep: glibc keeps freed memory for reuse, for every library alike "
                        "(no page faults for each call's fresh buffers; zoo.runtime.malloc; "
                        "recorded); system: glibc's defaults")
    p.add_argument("--torch-compile", action="store_true", help="add the torch.compile style")
    p.add_argument("--torch-threads", type=positive_int, default=None, metavar="N",
                   help="torch.set_num_threads(N) (default: PyTorch's own choice)")
    p.add_argument("--mesh", default=None, metavar="N|DxM",
                   help="time the sharded step of every JAX library on N devices (a data axis) "
                        "or D x M (data x model); on the CPU, N host devices are made "
                        "(PyTorch is not sharded: left out)")
    p.add_argument("--strategy", choices=tuple(STRATEGIES), default=None,
                   help="with --mesh: how parameters are split (default fsdp; docs/scaling.md)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--wide", action="store_true",
                   help="every column (min, dispatch, throughput, TFLOP/s, GB/s, memory); the "
                        "default columns fit an 80-column terminal")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also draw the run's times per mode (median, p10-p90) into this PNG")
    return p


def config_from_args(args: argparse.Namespace) -> Any:
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
    shape, not_sharded = None, ()
    if args.strategy is not None and args.mesh is None:
        raise MeshError(f"--strategy {args.strategy} needs --mesh (N or DATAxMODEL devices)")
    if args.mesh is not None:
        shape = parse_mesh(args.mesh)
        impls, not_sharded = mesh_impls(impls, args)
    return BenchConfig(
        arch=arch, impls=impls,
        calls=resolve_calls(args.call, impls, torch_compile=args.torch_compile,
                            steps_per_call=args.steps_per_call),
        modes=tuple(modes), batch=args.batch or (preset.batch if preset else DEFAULT_BATCH[arch]),
        dtype=args.dtype or (preset.dtype if preset else "float32"), model_config=overrides,
        preset=preset.name if preset else None, method=args.method, warmup=args.warmup,
        repeat=args.repeat or 20, rounds=args.rounds, settle_s=args.settle / 1e3, seed=args.seed,
        torch_compile=args.torch_compile,
        torch_threads=args.torch_threads, profile=args.profile, precision=args.precision,
        check=args.check, steps_per_call=args.steps_per_call, xla_cpu_flags=args.xla_cpu_flags,
        mesh=shape, strategy=args.strategy or "fsdp", not_sharded=not_sharded)


def mesh_impls(impls: tuple[str, ...], args: argparse.Namespace
               ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Under --mesh: (the JAX libraries, the others left out); only `zoo.runtime.fast`'s sharded
    step is
    timed, so other call styles, fused steps and torch.compile are refused."""
    sharded = tuple(i for i in impls if library(i).is_jax)
    if not sharded:
        raise MeshError(f"--mesh: none of {list(impls)} is a JAX library; PyTorch is not sharded")
    if args.call not in ("default", "fast"):
        raise MeshError(f"--mesh times zoo.runtime.fast's sharded step only; --call {args.call} "
                        "is not sharded")
    if args.steps_per_call > 1 or args.torch_compile:
        raise MeshError("--mesh times one zoo.runtime.fast step per call: drop --steps-per-call "
                        "and --torch-compile")
    return sharded, tuple(i for i in impls if i not in sharded)
