"""One process on 8 CPU devices: a training step of the architectures whose tiny configs hold
every layer kind, loss and input between them (`tests.kind_cover`), on one device (in the
first JAX library) and on 8 devices under fsdp (dp until every library has met it; tp on 4x2
where there are attention heads or a vocabulary, ep on 4x2 where there are experts); prints a
JSON report that tests/test_sharding.py checks: each sharded step against the one-device step.
Each (architecture, strategy) runs in one JAX library, the libraries taken in turn per strategy
so that every library meets every strategy (ep, which one architecture has, in every library);
with `--exhaustive`, in every library, and the libraries are also compared with each other
under each strategy. Run as `python -m tests.sharding_worker [--exhaustive]` (it sets the
device count before JAX starts, so it cannot run inside the test process)."""

from __future__ import annotations

import functools
import itertools
import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
import optax

import canonical
import zoo
import zoo.runtime.fast
from tests.kind_cover import covering_archs
from zoo.registry import walk_facts
from zoo.runtime import precision, sharding
from zoo.runtime.training import LOSSES, targets

BATCH = 16
MESHES = {"dp": (8,), "fsdp": (8,), "tp": (4, 2), "ep": (4, 2)}
EVERY_LIBRARY = {"ep"}  # one architecture has experts: it meets ep in every library
# dp splits the batch as fsdp does (the same batch sharding, the same global BatchNorm
# statistics and losses) and replicates the parameters, which no layer kind declares: it runs
# until every library has met it, while fsdp, whose parameter split is per layer kind, runs on
# every architecture.
ONCE_PER_LIBRARY = {"dp"}
AXES = {1: (sharding.DATA,), 2: (sharding.DATA, sharding.MODEL)}
# Every dimension divisible by 8: fsdp must then divide the bytes per device by 8.
DIVISIBLE_MLP = {"in_features": 64, "hidden": (128, 128), "out_features": 16}


def _train_step(cfg: zoo.Config, impl: str, mesh: jax.sharding.Mesh | None,
                strategy: str) -> zoo.runtime.fast.TrainStep:
    model = zoo.create(cfg, impl, mesh=mesh, strategy=strategy)
    return zoo.runtime.fast.train_step(model, impl, optax.sgd(0.1, momentum=0.9), LOSSES[cfg.LOSS],
                               mesh=mesh)


def _step(cfg: zoo.Config, impl: str, mesh: jax.sharding.Mesh | None, strategy: str) -> tuple:
    """(loss, canonical state after one step, parameter + optimizer bytes per device)."""
    step = _train_step(cfg, impl, mesh, strategy)
    nbytes = sharding.bytes_per_device((step.params, step.opt_state))
    api = zoo.interface(impl)
    x = api.to_native(zoo.example_input(cfg, BATCH, seed=1))
    loss = float(step(x, api.to_native(targets(cfg, BATCH, jax.random.key(2)))))
    state = canonical.read(step.model(), impl, **walk_facts(cfg, impl))
    return loss, {k: np.asarray(v) for k, v in state.items()}, nbytes


def _strategies(cfg: zoo.Config, impl: str) -> list[str]:
    """dp (the batch sharded), fsdp (the parameters too); tp where the model has attention
    heads or a vocabulary to split (a language model's q/k/v projections are linear layers:
    their heads are split with the MLP's outputs); ep where it has a mixture's experts."""
    axes = {a for arrays in sharding.logical_axes(zoo.create(cfg, impl), impl, cfg).values()
            for names in arrays.values() for a in names}
    return ["dp", "fsdp", *(["tp"] if {"heads", "vocab"} & axes else []),
            *(["ep"] if "expert" in axes else [])]


def _diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """The largest |a - b| / (1 + |b|) over every canonical array."""
    return max(float(np.max(np.abs(a[k] - b[k]) / (1 + np.abs(b[k])), initial=0.0)) for k in b)


def _agreement(arch: str, name: str, by_impl: dict[str, tuple]) -> dict:
    """The largest loss and canonical-state differences between any two libraries' steps
    under strategy `name`."""
    pairs = list(itertools.combinations(by_impl.values(), 2))
    return {"arch": arch, "strategy": name, "impls": list(by_impl),
            "loss_diff": max((abs(a[0] - b[0]) for a, b in pairs), default=0.0),
            "state_diff": max((_diff(a[1], b[1]) for a, b in pairs), default=0.0)}


def _runs(cfg: zoo.Config, impls: list[str], turns: dict[str, int],
          every: bool) -> list[tuple[str, str]]:
    """The (library, strategy) steps to run for `cfg`: every library under each of its
    strategies when `every`, else each strategy in the next library of its turn (`turns`
    counts, per strategy, the architectures it has run on)."""
    of = {impl: _strategies(cfg, impl) for impl in impls}
    runs = []
    for name in dict.fromkeys(name for names in of.values() for name in names):
        able = [i for i in impls if name in of[i]]
        start = turns.get(name, list(MESHES).index(name))
        turns[name] = start + 1
        if not every and name in ONCE_PER_LIBRARY and start >= len(impls):
            continue
        each_library = every or name in EVERY_LIBRARY
        runs += [(i, name) for i in (able if each_library else [able[start % len(able)]])]
    return runs


def main() -> None:
    every = "--exhaustive" in sys.argv[1:]
    precision.set_global(precision.EXACT)
    jax.config.update("jax_disable_most_optimizations", True)
    report, agreement, turns = [], [], {}
    for arch in covering_archs(tuple(zoo.ARCHS)):
        cfg = zoo.tiny_config(arch)
        impls = [i for i in zoo.JAX_IMPLS if zoo.architecture(arch).has(i)]
        loss1, state1, bytes1 = _step(cfg, impls[0], None, "dp")  # one device, one library
        runs: dict[str, dict[str, tuple]] = {}
        for impl, name in _runs(cfg, impls, turns, every):
            shape = MESHES[name]
            loss, state, nbytes = _step(cfg, impl, jax.make_mesh(shape, AXES[len(shape)]), name)
            runs.setdefault(name, {})[impl] = loss, state
            report.append({"arch": arch, "impl": impl, "strategy": name, "mesh": list(shape),
                           "loss_diff": abs(loss - loss1), "state_diff": _diff(state, state1),
                           "bytes_one_device": bytes1, "bytes_per_device": nbytes})
        agreement += [_agreement(arch, name, by_impl) for name, by_impl in runs.items()
                      if len(by_impl) > 1]
    mesh = jax.make_mesh((8,), (sharding.DATA,))
    divisible = zoo.make_config("mlp", **DIVISIBLE_MLP)
    memory = {}
    for impl in zoo.JAX_IMPLS:
        for name, on in (("one", None), ("dp", mesh), ("fsdp", mesh)):
            step = _train_step(divisible, impl, on, name if on else "dp")
            memory[f"{impl}/{name}"] = sharding.bytes_per_device((step.params, step.opt_state))
    json.dump({"devices": jax.device_count(), "steps": report, "libraries": agreement,
               "memory": memory, "constrained": _constrained(mesh),
               "nnx_partition_specs": _nnx_partition_specs(divisible, mesh)}, sys.stdout)


def _constrained(mesh: jax.sharding.Mesh) -> dict[str, str]:
    """Per JAX library: the partition of a replicated batch after its `Library.constrain` to
    the batch's split, inside `jax.jit` (what a mesh step does to `x` and `target`)."""
    mesh = sharding.auto(mesh)
    x = jax.device_put(np.ones((BATCH, 3), np.float32), sharding.replicated(mesh))
    where = sharding.batch_sharding(mesh)
    libs = {impl: zoo.libraries.library(impl) for impl in zoo.JAX_IMPLS}
    return {impl: str(jax.jit(functools.partial(lib.constrain, where=where))({"x": x})[
        "x"].sharding.spec) for impl, lib in libs.items()}


def _nnx_partition_specs(cfg: zoo.Config, mesh: jax.sharding.Mesh) -> dict[str, list]:
    """Per array of an NNX model sharded with fsdp: (the partition its array lies in, the one
    `nnx.get_partition_spec` reads from the Variables' metadata)."""
    from flax import nnx

    model = zoo.create(cfg, "nnx", mesh=mesh, strategy="fsdp")
    state = nnx.state(model, nnx.Param)
    placed = jax.tree.map(lambda v: str(v.sharding.spec), nnx.to_pure_dict(state))
    read = jax.tree.map(str, nnx.to_pure_dict(nnx.get_partition_spec(state)))
    flat = jax.tree_util.tree_flatten_with_path
    return {jax.tree_util.keystr(p): [a, b] for (p, a), (_, b)
            in zip(flat(placed)[0], flat(read)[0], strict=True)}


if __name__ == "__main__":
    main()
