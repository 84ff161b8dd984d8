"""`python -m zoo.bench dispatch`: the per-call overhead of every call style against the floor.

Three workloads where the work per call is small, so that what is measured is the cost of
reaching the compiled program:

- `identity`: `y = x * scale` on a (1, 16) input (one parameter);
- `mlp`: the default zoo MLP (784-512-512-10) at batch 1;
- `static10k`: the identity carrying 10,000 static leaves (a tuple of ints held by the module:
  a plain Equinox field, a Linen attribute, an NNX attribute, a PyTorch attribute);
- `mlp_train`: one training step of that MLP at batch 1 (cross-entropy, Adam), every training
  style, plus `zoo.runtime.fast` with K in {1, 10, 100} steps per call (`fused K=10`, `fused K=100`:
  one `lax.scan` per call; times per step = call time / K).

Training also gets a lower bound, "optimizer alone, fused K=100": the same Adam update
of the same parameters with fixed gradients, K = 100 steps in one `lax.scan` (no forward, no
backward). A fused step cannot be faster than its optimizer update alone, which for this MLP
(670k parameters; Adam reads and writes parameters, both moments and the gradient) is a memory-
traffic cost, not a dispatch cost: the report gives each fused row's ratio to it.

The floor is a raw `jax.jit` on pre-flattened arrays (for `mlp_train`: of a hand-written Adam
step of the same MLP, one step per call) of a hand-written `jax.numpy` function of
the same computation (MLP weights in the canonical (out, in) layout, `einsum("bi,oi->bo")`),
called directly. Because libraries lay out parameters differently (Flax keeps Dense kernels as
(in, out)), their compiled programs can run slower or faster than that floor for reasons that
have nothing to do with dispatch; each library therefore also gets its own floor, "own program":
the raw `jax.jit` of exactly the program its styles compile (the uniform interface's apply),
called directly with pre-flattened arrays, and every style gets a ratio to it as well.

Every style is timed call by call (`block_until_ready` after each), interleaved with the others
in a seeded random order per round, each round after untimed calls of its own (`timing.settle`),
so that machine noise hits all of them alike; the table gives medians and ratios.

Each result row has a `role` (`ROLES`): the floor and the bounds belong to no library (no
`impl`); a library's own program and its call styles carry their `impl`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import zoo
from zoo.arguments import ArgumentParser, positive_float, positive_int
from zoo.bench.accel import configure_allocator
from zoo.bench.display import make_console
from zoo.bench.options import parse_impls
from zoo.bench.records import OWN, record_base, save
from zoo.bench.styles import (
    available_styles,
    default_style,
    idiomatic_style,
    skipped_styles,
    styles,
)
from zoo.bench.subjects import LEARNING_RATE, Subject, Task, make_task
from zoo.bench.tables import dispatch_table, to_rich
from zoo.bench.timing import Prepared, round_orders, settle, summarize
from zoo.libraries import library
from zoo.registry import Architecture
from zoo.runtime import precision as policy

WORKLOADS: dict[str, str] = {  # {mlp}: the MLP's widths
    "identity": "identity, batch 1",
    "mlp": "MLP {mlp}, batch 1",
    "static10k": "identity + 10,000 static leaves",
    "mlp_train": "MLP {mlp} training step (Adam), batch 1",
}
TRAIN_WORKLOADS = ("mlp_train",)
FUSED_STEPS = (10, 100)  # K of the fused rows of training workloads (K = 1: "fast")
TARGET_RATIO = 1.1
FUSED_TARGET = 0.2  # fused K=100, per step, vs the single-call floor
FLOOR = "raw jax.jit, pre-flattened"
BOUND = "optimizer alone, fused K=100"
N_STATIC = 10_000
FEATURES = 16


@dataclass(frozen=True)
class Row:
    """What one timed entry is: `role` "floor" (the hand-written program, raw), "bound" (a lower
    bound no library can beat), "own" (a library's own program, raw) or "style" (one of its
    call styles); `impl` only for the last two."""

    role: str
    call: str
    impl: str | None = None


@dataclass(frozen=True)
class IdentityConfig:
    """The identity workloads' model: `x * scale` on FEATURES inputs, carrying `table`."""

    table: tuple[int, ...] = ()
    arch: ClassVar[str] = "identity"

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (FEATURES,)

    @classmethod
    def tiny(cls) -> IdentityConfig:
        return cls()


class EqxIdentity(eqx.Module):
    """`x * scale`; `table` is a plain field (Equinox sees its ints as leaves)."""

    scale: jax.Array
    table: tuple
    config: IdentityConfig = eqx.field(static=True)

    def __init__(self, config: IdentityConfig, *, key: Any = None, dtype: Any = None) -> None:
        self.config, self.table = IdentityConfig(), config.table  # the ints stay leaves
        self.scale = jnp.ones((), dtype)

    def __call__(self, x: jax.Array, *, key: Any = None) -> jax.Array:
        return x * self.scale


class LinenIdentity(nn.Module):
    config: IdentityConfig
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        return x * self.param("scale", nn.initializers.ones, (), self.param_dtype)


class NNXIdentity(nnx.Module):
    def __init__(self, config: IdentityConfig, *, rngs: Any = None,
                 param_dtype: Any = jnp.float32) -> None:
        self.config, self.table = config, config.table
        self.scale = nnx.Param(jnp.ones((), param_dtype))

    def __call__(self, x: jax.Array, *, rngs: Any = None) -> jax.Array:
        return x * self.scale[...]


# The identity in every library, built by each library's own initialisation (scale = 1).
IDENTITY = Architecture(IdentityConfig, dict(eqx=EqxIdentity, linen=LinenIdentity,
                                             nnx=NNXIdentity,
                                             torch="zoo.bench.dispatch_torch:TorchIdentity"))


def _identity(impl: str, table: tuple) -> Any:
    return library(impl).native_init(IDENTITY.model_class(impl), IdentityConfig(table),
                                     jax.random.key(0), "float32")


def _train_floor(mlp: Any, leaves: list[jax.Array], task: Task) -> Prepared:
    """A hand-written Adam step of `mlp` on pre-flattened leaves, raw `jax.jit`, one per call."""
    tx = optax.adam(LEARNING_RATE)

    def step(leaves: list[jax.Array], opt: Any, x: jax.Array, labels: jax.Array) -> tuple:
        def loss(leaves: list[jax.Array]) -> jax.Array:
            return optax.softmax_cross_entropy_with_integer_labels(mlp(leaves, x), labels).mean()

        value, grads = jax.value_and_grad(loss)(leaves)
        updates, opt = tx.update(grads, opt, leaves)
        return optax.apply_updates(leaves, updates), opt, value

    return Prepared(jax.jit(step), (leaves, tx.init(leaves), task.x, task.target))


def _optimizer_bound(leaves: list[jax.Array], steps: int) -> Prepared:
    """The Adam update alone (fixed gradients), `steps` of them in one `lax.scan` per call: what
    a fused training step costs at least."""
    tx = optax.adam(LEARNING_RATE)
    grads = [jnp.full_like(a, 1e-3) for a in leaves]

    def loop(leaves: list[jax.Array], opt: Any) -> tuple:
        def body(carry: tuple, _: None) -> tuple:
            params, opt = carry
            updates, opt = tx.update(grads, opt, params)
            return (optax.apply_updates(params, updates), opt), None

        return jax.lax.scan(body, (leaves, opt), None, length=steps)[0]

    return Prepared(jax.jit(loop), (leaves, tx.init(leaves)), steps=steps)


def _entries(impl: str, subject: Subject, mode: str) -> tuple[dict[Row, Prepared], Row | None]:
    """Every style of `impl` in `mode` (training: also the fused rows) and its own-program
    floor (the compiled program of `zoo.runtime.fast` called raw; None for PyTorch)."""

    entries: dict[Row, Prepared] = {}
    own = None
    if not subject.is_torch:
        own = Row("own", OWN, impl)
        if mode == "forward":
            fwd = subject.fast_forward()
            entries[own] = Prepared(fwd.func, (*fwd.args, subject.x))
        else:
            step = subject.fast_train()
            entries[own] = Prepared(step.jitted, (*step.leaves, *subject.train_args()))
    for style in available_styles(impl):
        try:
            entries[Row("style", style, impl)] = styles(impl)[style](subject, mode)
        except Exception:  # an optional style this installation cannot build
            if default_style(impl) == style:
                raise
    if mode == "train" and not subject.is_torch:
        for k in FUSED_STEPS:
            fused = dataclasses.replace(subject, steps_per_call=k, _cache={})
            entries[Row("style", f"fused K={k}", impl)] = styles(impl)["fused"](fused, mode)
    return entries, own


def mlp_config(tiny: bool = False) -> zoo.Config:
    """The MLP workloads' model: the zoo's default MLP, or its tiny config (`--tiny`)."""
    return zoo.tiny_config("mlp") if tiny else zoo.make_config("mlp")


def describe(name: str, tiny: bool = False) -> str:
    """A workload in words ("MLP 784-512-512-10, batch 1")."""
    return WORKLOADS[name].format(mlp="-".join(map(str, mlp_config(tiny).widths)))


def workload(name: str, impls: tuple[str, ...], tiny: bool = False
             ) -> tuple[dict[str, Subject], Prepared, dict[Row, Prepared]]:
    """The subjects of a workload (one per impl), its floor and its bounds."""
    if name in ("mlp", "mlp_train"):
        config = mlp_config(tiny)
        task = make_task(config, 1)
        state = zoo.canonical_init(config, 0)
        natives = {impl: zoo.create(config, impl) for impl in impls}
        leaves = [jnp.asarray(state[f"layers.{i}.{k}"]) for i in range(len(config.widths) - 1)
                  for k in ("weight", "bias")]

        def mlp(leaves: list[jax.Array], x: jax.Array) -> jax.Array:
            h = x
            for i in range(0, len(leaves), 2):
                h = jax.nn.relu(h) if i else h
                h = jnp.einsum("bi,oi->bo", h, leaves[i]) + leaves[i + 1][None]
            return h

        floor, bounds = Prepared(jax.jit(mlp), (leaves, task.x)), {}
        if name == "mlp_train":
            floor = _train_floor(mlp, leaves, task)
            bounds = {Row("bound", BOUND): _optimizer_bound(leaves, max(FUSED_STEPS))}
    else:
        table = tuple(range(N_STATIC)) if name == "static10k" else ()
        x = jax.random.normal(jax.random.key(0), (1, FEATURES))
        task = Task(x, x, "mse")
        natives = {impl: _identity(impl, table) for impl in impls}
        floor = Prepared(jax.jit(lambda leaves, x: x * leaves[0]), ([jnp.ones(())], x))
        bounds = {}
    return {impl: Subject(impl, natives[impl], task) for impl in impls}, floor, bounds


def interleaved(entries: dict[Any, Prepared], rounds: int, budget_s: float,
                on_round: Any = None) -> dict[Any, list[float]]:
    """Per-step times (call time / steps per call) of every entry, measured in `rounds`
    rounds of about `budget_s` seconds per entry, in a seeded random order each round, each
    entry's round after `budget_s` of untimed calls (`timing.settle`)."""
    names = list(entries)
    per_round = {}
    for name, p in entries.items():  # warm-up: compile, then estimate the call time
        for _ in range(3):
            p.block(p.fn(*p.args))
        t0 = time.perf_counter()
        for _ in range(10):
            p.block(p.fn(*p.args))
        per_call = (time.perf_counter() - t0) / 10
        per_round[name] = int(min(500, max(5, budget_s / max(per_call, 1e-7))))
    samples: dict[Any, list[float]] = {n: [] for n in names}
    clock = time.perf_counter
    for order in round_orders(names, rounds, seed=0):
        for name in order:
            p, out = entries[name], samples[name]
            settle(p, budget_s)
            fn, args, block, steps = p.fn, p.args, p.block, p.steps
            for _ in range(per_round[name]):
                t0 = clock()
                block(fn(*args))
                out.append((clock() - t0) / steps)
        if on_round is not None:
            on_round()
    return samples


def _result(wname: str, mode: str, row: Row, p: Prepared, values: list[float],
            floor_s: float, own_s: float | None) -> dict[str, Any]:
    """One row of the record: its role (and library), times and ratios (to the library's own
    program: None for rows that have none)."""

    stats = summarize(values)
    median = stats["median_s"]
    return {"workload": wname, "role": row.role, **({"impl": row.impl} if row.impl else {}),
            "call": row.call, "time": stats, "mode": mode, "steps_per_call": p.steps,
            "idiomatic": row.role == "style" and idiomatic_style(row.impl) == row.call,
            "ratio_to_floor": median / floor_s,
            "ratio_to_own": None if own_s is None else median / own_s,
            "overhead_s": None if own_s is None else median - own_s}


def _summary(results: list[dict[str, Any]], impls: tuple[str, ...],
             workloads: tuple[str, ...]) -> dict[str, Any]:
    """Per JAX library and workload: its fastest style against the floor and its own program;
    training: its fused K=100 row against its own program, the floor and the optimizer bound."""
    summary: dict[str, Any] = {}
    for impl in (i for i in impls if library(i).is_jax):
        summary[impl] = {}
        for w in workloads:
            rows = [r for r in results if r.get("impl") == impl and r["workload"] == w
                    and r["role"] == "style"]
            best = min(rows, key=lambda r: r["ratio_to_floor"])
            per = summary[impl][w] = {
                "call": best["call"], "ratio_to_floor": best["ratio_to_floor"],
                "ratio_to_own": best["ratio_to_own"],
                "within_target": best["ratio_to_floor"] <= TARGET_RATIO,
                "within_target_own": best["ratio_to_own"] <= TARGET_RATIO}
            fused = next((r for r in rows if r["steps_per_call"] == max(FUSED_STEPS)), None)
            bound = next((r for r in results if r["role"] == "bound" and r["workload"] == w),
                         None)
            if fused:
                # Judged against the library's own program called once per step (the same
                # program, so the ratio is what fusing saves, not a layout difference).
                per["fused"] = {
                    "call": fused["call"], "ratio_to_floor": fused["ratio_to_floor"],
                    "ratio_to_own": fused["ratio_to_own"], "target": FUSED_TARGET,
                    "within_target": fused["ratio_to_own"] <= FUSED_TARGET,
                    "ratio_to_bound": None if bound is None else (
                        fused["time"]["median_s"] / bound["time"]["median_s"]),
                    "bound_to_floor": None if bound is None else bound["ratio_to_floor"]}
    return summary


def run_dispatch(impls: tuple[str, ...], rounds: int = 100, budget_s: float = 0.01,
                 workloads: tuple[str, ...] = tuple(WORKLOADS), console: Any = None,
                 progress: bool = True, tiny: bool = False) -> dict[str, Any]:
    from rich.progress import Progress

    results: list[dict[str, Any]] = []
    with Progress(console=console, transient=True, disable=not progress) as bar:
        task_id = bar.add_task("dispatch", total=rounds * len(workloads))
        for wname in workloads:
            subjects, floor, bounds = workload(wname, impls, tiny)
            floor_row = Row("floor", FLOOR)
            entries: dict[Row, Prepared] = {floor_row: floor, **bounds}
            own: dict[str, Row] = {}
            mode = "train" if wname in TRAIN_WORKLOADS else "forward"
            for impl in impls:
                styles, own_row = _entries(impl, subjects[impl], mode)
                entries.update(styles)
                if own_row is not None:
                    own[impl] = own_row
            samples = interleaved(entries, rounds, budget_s, lambda: bar.advance(task_id))
            medians = {row: float(np.median(v)) for row, v in samples.items()}
            results += [_result(wname, mode, row, entries[row], values, medians[floor_row],
                                medians[own[row.impl]] if row.impl in own else None)
                        for row, values in samples.items()]
    record = record_base("dispatch")
    record["config"] = {"impls": list(impls), "rounds": rounds, "budget_s": budget_s,
                        "workloads": {w: describe(w, tiny) for w in workloads}, "tiny": tiny,
                        "target_ratio": TARGET_RATIO, "fused_steps": [1, *FUSED_STEPS],
                        "fused_target": FUSED_TARGET}
    record["results"] = results
    record["skipped_styles"] = skipped_styles(impls)
    record["summary"] = _summary(results, impls, workloads)
    return record


def verdict_lines(summary: dict[str, Any]) -> list[str]:
    """The console's verdict, one line per library and workload (fused rows: two)."""
    lines = [f"fastest style of each library vs the floor (target {TARGET_RATIO}x):"]
    for impl, per in summary.items():
        for w, v in per.items():
            miss = "" if v["within_target"] else " (misses)"
            lines.append(f"  {impl} {w}: {v['call']}, {v['ratio_to_floor']:.2f}x floor, "
                         f"{v['ratio_to_own']:.2f}x own{miss}")
    for impl, per in summary.items():
        for w, v in per.items():
            if "fused" not in v:
                continue
            f = v["fused"]
            lines.append(f"{impl} {w}, {f['call']} per step: {f['ratio_to_own']:.3f}x its own "
                         f"program, {f['ratio_to_floor']:.3f}x the floor")
            bound = ("" if f.get("ratio_to_bound") is None else
                     f"; {f['ratio_to_bound']:.2f}x the optimizer alone, itself "
                     f"{f['bound_to_floor']:.3f}x the floor")
            lines.append(f"  target <= {FUSED_TARGET}x: {'met' if f['within_target'] else 'missed'}"
                         f"{bound}")
    return lines


def dispatch_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m zoo.bench dispatch",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="all", type=parse_impls)
    p.add_argument("--workload", default=",".join(WORKLOADS),
                   help=f"comma list of {list(WORKLOADS)}")
    p.add_argument("--rounds", type=positive_int, default=100)
    p.add_argument("--budget", type=positive_float, default=0.01,
                   help="seconds per style per round (sets the calls per round)")
    p.add_argument("--tiny", action="store_true",
                   help="the MLP workloads at the MLP's tiny config (a smoke test)")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--record", action="store_true")
    p.add_argument("--results-dir", default="bench/results", help=argparse.SUPPRESS)
    p.add_argument("--precision", choices=policy.PRECISIONS, default="default",
                   help="float32 matmul precision of the MLP workloads (default: the "
                        "libraries' own, TF32 on a GPU)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    workloads = tuple(w for w in args.workload.split(",") if w)
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload {unknown}; choose from {list(WORKLOADS)}")
    console = make_console()
    allocator = configure_allocator("torch" in args.impl)
    with policy.use(args.precision):
        record = run_dispatch(args.impl, args.rounds, args.budget, workloads, console,
                              not args.no_progress, args.tiny)
    record["precision"] = args.precision
    record["allocator"] = allocator
    for w in workloads:
        console.print(to_rich(dispatch_table(record, [w])))
    for line in verdict_lines(record["summary"]):
        console.print(line, highlight=False)
    for f in record["skipped_styles"]:
        console.print(f"not installed: {f['impl']} {f['call']}: {f['reason']}")
    save(record, args.json, args.results_dir if args.record else None, console)
    return 0
