"""`python -m zoo.bench partition`: what a trainable / frozen split costs per training step.

The seed's question (Equinox's two-way `partition` against a flat, multi-way partition of many
leaves) on a many-leaf model: GPT-2 of the tiny width at 12 layers (`--layers`), LoRA (rank 4)
on every `c_attn`, in each JAX library, two `zoo.runtime.fast` steps (Adam, next-token loss):

- `whole`: every parameter trained (the base too), the whole tree carried from step to step;
- `partitioned`: `trainable=zoo.lora.TRAINABLE`: the factors trained and carried, the frozen
  base an argument of each call (`Interface.partition`, split once at construction).

Besides the steps, `split` times the split itself outside any jit, `Interface.partition` then
`combine` of the whole parameter tree (Equinox's `eqx.partition` / `eqx.combine`, NNX's
`nnx.split_state` / `merge_state`, Linen's dict through `eqx.partition`): the cost a call
style that re-partitions at every call (`eqx.filter_jit`, `nnx.jit`) pays per step on top.

Steps are timed call by call (`block_until_ready`), the styles interleaved in a seeded random
order per round; the table gives medians (ms) and the partitioned step's ratio to the whole one.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np
import optax

import zoo
import zoo.lora
from zoo.arguments import ArgumentParser, positive_int
from zoo.bench.display import make_console
from zoo.bench.options import parse_impls
from zoo.bench.records import RESULTS_DIR, record_base, write_json
from zoo.bench.timing import round_orders, summarize
from zoo.libraries import interface
from zoo.runtime import fast
from zoo.runtime.training import next_token

STYLES = ("whole", "partitioned")


def _steps(config: zoo.Config, impl: str) -> dict[str, Any]:
    model = zoo.lora.add(zoo.create(config, impl, seed=0), impl, rank=4, alpha=8,
                         targets=("c_attn",))
    return {"whole": fast.train_step(model, impl, optax.adam(1e-3), next_token),
            "partitioned": fast.train_step(model, impl, optax.adam(1e-3), next_token,
                                           trainable=zoo.lora.TRAINABLE)}, model


def _split_ms(model: Any, impl: str, repeats: int) -> float:
    api = interface(impl)
    static, params, _ = api.split(model)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        api.combine(*api.partition(static, params, zoo.lora.TRAINABLE))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def run_partition(impls: list[str], layers: int, batch: int, rounds: int,
                  calls: int) -> dict[str, Any]:
    config = zoo.tiny_config("gpt2", n_layer=layers)
    x = np.random.default_rng(0).integers(0, config.vocab_size,
                                          (batch, config.seq_len)).astype(np.int32)
    record = record_base("partition")
    steps, models, rows = {}, {}, {}
    for impl in impls:
        built, models[impl] = _steps(config, impl)
        api = interface(impl)
        static, params, _ = api.split(models[impl])
        trainable, frozen = api.partition(static, params, zoo.lora.TRAINABLE)
        rows[impl] = {"leaves": len(jax.tree.leaves(params)),
                      "trainable_leaves": len(jax.tree.leaves(trainable)),
                      "frozen_leaves": len(jax.tree.leaves(frozen))}
        for style, step in built.items():
            for _ in range(3):  # compile and warm up
                jax.block_until_ready(step(x, x))
            steps[impl, style] = step
    samples: dict[Any, list[float]] = {key: [] for key in steps}
    for order in round_orders(list(steps), rounds, seed=0):
        for key in order:
            for _ in range(calls):
                start = time.perf_counter()
                jax.block_until_ready(steps[key](x, x))
                samples[key].append(time.perf_counter() - start)
    for (impl, style), times in samples.items():
        rows[impl][style] = {k.replace("_s", "_ms"): v * 1e3 if isinstance(v, float) else v
                             for k, v in summarize(times).items()}
    for impl in impls:
        rows[impl]["ratio"] = (rows[impl]["partitioned"]["median_ms"]
                               / rows[impl]["whole"]["median_ms"])
        rows[impl]["split_ms"] = _split_ms(models[impl], impl, repeats=20)
    record["config"] = {"arch": "gpt2", "n_layer": layers, "n_embd": config.n_embd,
                        "batch": batch, "seq_len": config.seq_len, "rank": 4,
                        "targets": ["c_attn"], "rounds": rounds, "calls_per_round": calls}
    record["results"] = rows
    record["host_load_avg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return record


def partition_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m zoo.bench partition",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="eqx,linen,nnx", type=parse_impls)
    p.add_argument("--layers", type=positive_int, default=12)
    p.add_argument("--batch", type=positive_int, default=4)
    p.add_argument("--rounds", type=positive_int, default=10)
    p.add_argument("--calls", type=positive_int, default=20, help="timed calls per round")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--record", action="store_true",
                   help=f"write {RESULTS_DIR}/<device>/partition-gpt2-<layers>l-b<batch>.json")
    args = p.parse_args(argv)
    impls = [i for i in args.impl if zoo.library(i).is_jax]
    record = run_partition(impls, args.layers, args.batch, args.rounds, args.calls)
    console = make_console()
    console.print(f"GPT-2 tiny, {args.layers} layers, batch {args.batch}, LoRA rank 4 on c_attn; "
                  f"load {record['host_load_avg'][0]:.2f} -> "
                  f"{record['host_load_avg_end'][0]:.2f}", highlight=False)
    console.print(f"{'impl':<6}{'leaves':>12}{'whole ms':>10}{'part. ms':>10}{'ratio':>7}"
                  f"{'split ms':>10}", highlight=False)
    for impl, row in record["results"].items():
        leaves = f"{row['trainable_leaves']}/{row['leaves']}"
        console.print(f"{impl:<6}{leaves:>12}{row['whole']['median_ms']:>10.3f}"
                      f"{row['partitioned']['median_ms']:>10.3f}{row['ratio']:>7.2f}"
                      f"{row['split_ms']:>10.3f}", highlight=False)
    paths = [args.json] if args.json else []
    if args.record:
        name = f"partition-gpt2-{args.layers}l-b{args.batch}.json"
        paths.append(os.path.join(RESULTS_DIR, record["device"]["slug"], name))
    for path in paths:
        write_json(record, path)
        console.print(f"wrote {path}")
    return 0
