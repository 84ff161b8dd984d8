"""`python -m zoo.bench breakdown`: where one step's time goes, per op category and library.

    python -m zoo.bench breakdown resnet --preset resnet18-cifar --batch 32 --impl nnx,torch
    taskset -c 0 python -m zoo.bench breakdown vit --preset vit-cifar --torch-threads 1

JAX: a `jax.profiler` trace of a few `zoo.runtime.fast` steps; every trace event (one XLA:CPU thunk)
is looked up in the compiled HLO and classified by the ops its (fused) computation contains
(`classify`). PyTorch: `torch.profiler` self CPU time of the `aten::` ops (`torch_category`).
Shares of a step are printed (unlike absolute times they survive a loaded machine), and the
time a step spends in the ops classified (not the gaps between them).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile
from typing import Any

import jax

from zoo.arguments import ArgumentParser, positive_int
from zoo.bench.generation import decode_step
from zoo.bench.presets import PresetError, find_preset
from zoo.bench.styles import torch_eager

IMPLS: tuple[str, ...] = ("eqx", "linen", "nnx", "torch")
# First match wins: a fusion holding a convolution is a convolution, whatever else it holds.
HLO_ORDER: tuple[tuple[str, str], ...] = (
    ("convolution", "convolution"), ("dot", "matmul"), ("reduce-window", "pooling"),
    ("select-and-scatter", "pooling"), ("reduce", "reduction"),
    ("transpose", "transpose/copy + elementwise"), ("copy", "transpose/copy + elementwise"),
    ("scatter", "gather/scatter"), ("gather", "gather/scatter"))
TORCH_ORDER: tuple[tuple[str, str], ...] = (
    ("conv", "convolution"), ("mm", "matmul"), ("linear", "matmul"), ("bmm", "matmul"),
    ("attention", "attention kernel"), ("norm", "normalization"), ("pool", "pooling"),
    ("copy", "transpose/copy + elementwise"), ("cat", "transpose/copy + elementwise"),
    ("sum", "reduction"), ("mean", "reduction"), ("softmax", "reduction"))
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^(?:ROOT )?%?([\w.\-]+) = .*? ([\w\-]+)\(")
_CALLS = re.compile(r"(?:calls|to_apply)=%?([\w.\-]+)")
_NO_WORK = frozenset({"while", "call", "conditional", "parameter", "constant", "tuple",
                      "get-tuple-element", "bitcast"})


def parse_hlo(hlo: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """HLO text -> (computation -> its instruction lines, instruction -> its line)."""
    computations: dict[str, list[str]] = {}
    lines: dict[str, str] = {}
    current = None
    for raw in hlo.splitlines():
        match = _COMPUTATION.match(raw)
        if match and not raw.startswith(" "):
            current = match.group(1)
            computations[current] = []
            continue
        line = raw.strip()
        if current is None or not line.startswith(("%", "ROOT")):
            continue
        computations[current].append(line)
        inst = _INSTRUCTION.match(line)
        if inst:
            lines[inst.group(1)] = line
    return computations, lines


def _ops(line: str, computations: dict[str, list[str]], seen: set[str]) -> set[str]:
    """The opcodes of `line` and of every computation it calls, recursively."""
    inst = _INSTRUCTION.match(line)
    ops = {inst.group(2)} if inst else set()
    for called in _CALLS.findall(line):
        if called not in seen:
            seen.add(called)
            for inner in computations.get(called, []):
                ops |= _ops(inner, computations, seen)
    return ops


def classify(hlo: str) -> dict[str, str]:
    """instruction name -> category, for every instruction of the compiled HLO text `hlo` that
    does work (loops and calls are left out: their bodies are traced on their own)."""
    computations, lines = parse_hlo(hlo)
    out = {}
    for name, line in lines.items():
        own = _INSTRUCTION.match(line).group(2)
        if own in _NO_WORK:
            continue
        ops = _ops(line, computations, set())
        out[name] = next((cat for op, cat in HLO_ORDER if op in ops), "elementwise")
    return out


def torch_category(op: str) -> str:
    """An `aten::` op's category (first matching substring of `TORCH_ORDER`)."""
    name = op.removeprefix("aten::")
    return next((cat for key, cat in TORCH_ORDER if key in name), "elementwise")


def shares(times: dict[str, float], categories: dict[str, str]) -> dict[str, float]:
    """Time per category over the events that have one, as fractions summing to 1."""
    total: collections.Counter[str] = collections.Counter()
    for name, t in times.items():
        if name in categories:
            total[categories[name]] += t
    whole = sum(total.values()) or 1.0
    return {cat: t / whole for cat, t in total.most_common()}


def _trace_times(directory: str, steps: int) -> dict[str, float]:
    """Seconds per step of every complete event in the trace under `directory`."""
    files = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
    if not files:
        raise RuntimeError(f"jax.profiler wrote no trace under {directory}")
    with gzip.open(files[0]) as f:
        events = json.load(f)["traceEvents"]
    times: collections.Counter[str] = collections.Counter()
    for event in events:
        # "$...": Python frames of the trace, not XLA thunks
        if event.get("ph") == "X" and not event["name"].startswith("$"):
            times[event["name"]] += event.get("dur", 0) / 1e6 / steps
    return dict(times)


def jax_breakdown(step: Any, args: tuple[Any, ...], steps: int, chained: bool = False
                  ) -> tuple[dict[str, float], float]:
    """Shares per HLO category of `step(*args)` (a `zoo.runtime.fast` forward or train step;
    `chained`: a step that donates its last argument and returns its next value, as a decode
    step its state) and the seconds a step of the ops classified."""
    categories = classify(step.lower(*args).compile().as_text())

    def run(args: tuple[Any, ...]) -> tuple[Any, ...]:
        out = jax.block_until_ready(step(*args))
        return (*args[:-1], out) if chained else args

    for _ in range(2):
        args = run(args)
    with tempfile.TemporaryDirectory() as directory:
        with jax.profiler.trace(directory):
            for _ in range(steps):
                args = run(args)
        times = _trace_times(directory, steps)
    return shares(times, categories), sum(t for n, t in times.items() if n in categories)


def torch_breakdown(run: Any, steps: int) -> tuple[dict[str, float], float]:
    """Shares per category of the `aten::` ops' self CPU time over `steps` calls of `run`, and
    their seconds a call."""
    from torch.profiler import ProfilerActivity, profile

    run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    times = {e.key: e.self_cpu_time_total for e in prof.key_averages()
             if e.key.startswith("aten::")}
    return (shares(times, {op: torch_category(op) for op in times}),
            sum(times.values()) / 1e6 / steps)


def breakdown_main(argv: list[str]) -> int:
    from zoo.bench.subjects import Subject, build_config, build_models, make_task

    p = ArgumentParser(prog="python -m zoo.bench breakdown",
                       description="share of one step's time per op category")
    p.add_argument("arch")
    p.add_argument("--preset", default=None)
    p.add_argument("--batch", type=positive_int, default=None)
    p.add_argument("--impl", default=None, help="comma list of eqx,linen,nnx,torch (default: "
                   "nnx,torch; decode: eqx,linen,nnx)")
    p.add_argument("--mode", choices=("forward", "train", "decode"), default="train",
                   help="decode: a step of zoo.generate's loop (JAX libraries; after a prompt "
                   "of 32 tokens or half the positions, batch 1 unless --batch)")
    p.add_argument("--steps", type=positive_int, default=5,
                   help="profiled steps (after 2 warm-ups)")
    p.add_argument("--torch-threads", type=positive_int, default=None, metavar="N",
                   help="torch.set_num_threads(N) (with `taskset -c 0` and N=1: one core each)")
    args = p.parse_args(argv)
    try:
        preset = find_preset(args.preset, args.arch) if args.preset else None
        config = build_config(args.arch, dict(preset.config) if preset else {}, "auto")
    except (PresetError, ValueError) as err:
        p.error(str(err))
    impls = tuple((args.impl or ("eqx,linen,nnx" if args.mode == "decode" else "nnx,torch"))
                  .split(","))
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        p.error(f"unknown --impl {unknown} (use {', '.join(IMPLS)})")
    if args.mode == "decode":
        if not getattr(config, "GENERATES", False):
            p.error(f"--mode decode: {args.arch} does not generate text")
        if "torch" in impls:
            p.error("--mode decode profiles the JAX libraries' step (--impl eqx,linen,nnx)")
    threads = args.torch_threads
    if threads is not None and "torch" in impls:
        import torch

        torch.set_num_threads(threads)
    batch = args.batch or (1 if args.mode == "decode" else preset.batch if preset else 8)
    dtype = preset.dtype if preset else "float32"
    task = make_task(config, batch, dtype)
    models = build_models(config, impls, dtype=dtype)
    print(f"{args.arch} {args.mode}, batch {batch}, load average "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for impl in impls:
        subject = Subject(impl, models[impl], task)
        if subject.is_torch:
            result, seconds = torch_breakdown(torch_eager(subject, args.mode).fn, args.steps)
        elif args.mode == "decode":
            result, seconds = jax_breakdown(*decode_step(impl, models[impl], config, batch),
                                            args.steps, chained=True)
        elif args.mode == "train":
            result, seconds = jax_breakdown(subject.fast_train(), subject.train_args(),
                                            args.steps)
        else:
            result, seconds = jax_breakdown(subject.fast_forward(), (subject.x,), args.steps)
        print(f"  {impl}: {1e3 * seconds:.2f} ms a step in these ops")
        for cat, share in result.items():
            print(f"    {cat:34s} {100 * share:5.1f}%")
    return 0
