"""Sharding a zoo model over a device mesh with JAX's own SPMD machinery.

    mesh = jax.make_mesh((8,), ("data",))
    model = zoo.create("vit_tiny", "nnx", mesh=mesh, strategy="fsdp")
    step = zoo.runtime.fast.train_step(model, "nnx", optax.adam(1e-3), loss_fn, mesh=mesh)

Every native array carries logical axis names, given once per layer kind
(`canonical.LayerKind.axes`: "embed", "mlp", "heads", "conv_out", "channels", ...). A
`Strategy` maps them onto the mesh axes `DATA` ("data") and `MODEL` ("model"):

- `dp`: parameters replicated, the batch sharded over "data".
- `fsdp`: as dp, and each parameter (hence its optimizer state and BatchNorm statistics) sharded
  over "data" along its largest named axis that the data axis divides; replicated otherwise.
- `tp`: as dp, and the "heads", "mlp" and "vocab" axes (attention heads, every linear layer's
  outputs, an embedding's rows) sharded over "model" where it divides them: a second mesh
  axis, e.g. `(4, 2)`. A language model's q/k/v projections are linear layers, so their
  outputs, the query heads and the key/value heads, are split over "model" with the MLP's
  gate and up projections; its token embedding (and a tied head) over the vocabulary.
- `ep`: as dp, and a mixture's stacked experts (their "expert" axis) split over "model" where
  it divides them (expert parallelism; the router and the rest replicated): each device holds
  its share of the experts, `jax.jit` moves the tokens to them.

The arrays are placed with `jax.device_put` onto `NamedSharding`s through the canonical walkers
(one mechanism for every library); `jax.jit` then partitions the computation (GSPMD). Each
array carries its sharding (`jax.tree.map(lambda a: a.sharding, params)` in every library);
an NNX model also records it as each Variable's `out_sharding` metadata, so that
`nnx.get_partition_spec(nnx.state(model))` reads it as in Flax's guide. Linen's idiom,
logical names and rules, is `logically_named` (`nn.LogicallyPartitioned` boxes) with
`logical_rules(strategy)` for `nn.logical_to_mesh_sharding`; Equinox's, `eqx.filter_shard`, is
how its `Library.constrain` splits a `zoo.runtime.fast` step's batch. Reductions
over the batch, BatchNorm's statistics included, are global: a BatchNorm layer normalises with
the statistics of the whole global batch, as on one device, in every library.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

import canonical
from canonical.kinds import KINDS
from zoo.configs import Config
from zoo.libraries import interface, library
from zoo.registry import walk_facts

DATA = "data"
MODEL = "model"
BATCH = "batch"  # the logical name of a batch axis, in the rules for Flax's logical axes

__all__ = ["BATCH", "DATA", "MODEL", "STRATEGIES", "Strategy", "auto", "batch_sharding",
           "bytes_per_device", "logical_axes", "logical_rules", "logically_named", "replicated",
           "shard", "shardings", "strategy"]


@dataclass(frozen=True)
class Strategy:
    """How logical axes map onto mesh axes.

    - `rules`: (logical axis, mesh axis) pairs, applied where the mesh axis divides the dim.
    - `fully_sharded`: shard each array's largest named axis still free over `DATA` (FSDP).
    """

    name: str
    rules: tuple[tuple[str, str], ...] = ()
    fully_sharded: bool = False

    def mesh_axes(self) -> tuple[str, ...]:
        """The mesh axes the strategy needs."""
        return (DATA, *dict.fromkeys(m for _, m in self.rules))

    def check(self, mesh: Mesh) -> None:
        missing = [a for a in self.mesh_axes() if a not in mesh.shape]
        if missing:
            raise ValueError(f"strategy {self.name!r} needs mesh axes {self.mesh_axes()}, the "
                             f"mesh has {tuple(mesh.axis_names)} (missing {missing})")

    def logical_rules(self) -> tuple[tuple[str, str], ...]:
        """The strategy as Flax's logical axis rules (`nn.logical_to_mesh_sharding(specs, mesh,
        rules)`, `nn.with_logical_constraint`): the batch over `DATA`, then `rules`. Flax
        applies a rule whatever the size, `spec` only where the mesh axis divides it: they
        agree where every dimension a rule maps is divisible. A fully sharded strategy has
        none: its choice of axis depends on each array's shape (see `spec`)."""
        if self.fully_sharded:
            raise ValueError(
                f"strategy {self.name!r} has no logical axis rules: it shards each array along "
                "its largest named axis that the data axis divides, a choice per array; take "
                "its shardings from zoo.runtime.sharding.shardings")
        return ((BATCH, DATA), *self.rules)

    def spec(self, axes: tuple[str | None, ...], shape: tuple[int, ...],
             mesh: Mesh) -> PartitionSpec:
        """The partition of an array of `shape` whose dimensions are the logical `axes`."""
        rules = dict(self.rules)
        out: list[str | None] = [None] * len(shape)
        for i, (ax, dim) in enumerate(zip(axes, shape, strict=True)):
            target = rules.get(ax) if ax is not None else None
            if target is not None and target not in out and dim % mesh.shape[target] == 0:
                out[i] = target
        if self.fully_sharded and DATA not in out:
            free = [i for i, ax in enumerate(axes) if ax is not None and out[i] is None
                    and shape[i] % mesh.shape[DATA] == 0]
            if free:
                out[max(free, key=lambda i: shape[i])] = DATA
        return PartitionSpec(*out)


STRATEGIES: dict[str, Strategy] = {
    "dp": Strategy("dp"),
    "fsdp": Strategy("fsdp", fully_sharded=True),
    "tp": Strategy("tp", rules=(("heads", MODEL), ("mlp", MODEL), ("vocab", MODEL))),
    "ep": Strategy("ep", rules=(("expert", MODEL),)),
}


def strategy(name: str | Strategy) -> Strategy:
    """The strategy called `name` (a ValueError names the known ones)."""
    if isinstance(name, Strategy):
        return name
    if name not in STRATEGIES:
        raise ValueError(f"unknown sharding strategy {name!r}; available: {list(STRATEGIES)}")
    return STRATEGIES[name]


def logical_rules(name: str | Strategy) -> tuple[tuple[str, str], ...]:
    """Strategy `name` as Flax's logical axis rules (`Strategy.logical_rules`)."""
    return strategy(name).logical_rules()


def auto(mesh: Mesh | AbstractMesh) -> Mesh | AbstractMesh:
    """`mesh` with every axis of type Auto (`jax.make_mesh` makes Explicit ones): the zoo lets
    `jax.jit` propagate shardings (GSPMD) rather than typing them on every array."""
    auto_types = (AxisType.Auto,) * len(mesh.axis_names)
    if tuple(mesh.axis_types) == auto_types:
        return mesh
    if isinstance(mesh, AbstractMesh):
        return AbstractMesh(mesh.axis_sizes, mesh.axis_names, axis_types=auto_types)
    return Mesh(mesh.devices, mesh.axis_names, axis_types=auto_types)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, batch_axis: int = 0) -> NamedSharding:
    """Arrays whose axis `batch_axis` is the batch, split over the mesh's `DATA` axis."""
    return NamedSharding(mesh, PartitionSpec(*(None,) * batch_axis, DATA))


def _layers(model: Any, impl: str, config: Config) -> tuple[Any, list[canonical.Layer]]:
    lib = library(impl)
    if not lib.is_jax:
        raise ValueError(f"impl={impl!r} is not a JAX library: only JAX models are sharded")
    return canonical.walker(impl), canonical.layers(model, impl, **walk_facts(config, impl))


def logical_axes(model: Any, impl: str, config: Config) -> dict[str, dict[str, tuple]]:
    """Per layer name, per native array name: its logical axes (the layer kind's table)."""
    w, found = _layers(model, impl, config)
    native = w.read(model, found)
    return {layer.name: {n: KINDS[layer.kind].logical_axes(w.family, n, a.ndim)
                         for n, a in native[layer.name].items()} for layer in found}


def shardings(model: Any, impl: str, mesh: Mesh, strategy_name: str | Strategy = "fsdp", *,
              config: Config) -> dict[str, dict[str, NamedSharding]]:
    """Per layer name, per native array name: where `strategy_name` puts the array of the
    native `model` on `mesh` (abstract arrays suffice: a skeleton, to restore a checkpoint
    straight onto its devices)."""
    strat, mesh = strategy(strategy_name), auto(mesh)
    strat.check(mesh)
    w, found = _layers(model, impl, config)
    native = w.read(model, found)
    return {layer.name: {n: NamedSharding(mesh, strat.spec(
        KINDS[layer.kind].logical_axes(w.family, n, len(a.shape)), a.shape, mesh))
        for n, a in native[layer.name].items()} for layer in found}


def logically_named(model: Any, impl: str, *, config: Config) -> Any:
    """A copy of the native `model` whose arrays are wrapped in the library's own box for
    logical axis names (`Library.logical_box`), named by their layer kinds' tables: for Linen,
    `(module, variables)` with `nn.LogicallyPartitioned` leaves, which `nn.get_partition_spec`
    reads and `nn.logical_to_mesh_sharding(..., logical_rules(strategy))` maps onto a mesh."""
    lib = library(impl)
    w, found = _layers(model, impl, config)
    native = w.read(model, found)
    boxed = {layer.name: {n: lib.logical_box(a, KINDS[layer.kind].logical_axes(
        w.family, n, len(a.shape))) for n, a in native[layer.name].items()} for layer in found}
    return w.write(interface(impl).clone(model), boxed, found)


def shard(model: Any, impl: str, mesh: Mesh, strategy_name: str | Strategy = "fsdp", *,
          config: Config) -> Any:
    """A copy of the native `model` (of zoo architecture `config`) whose arrays lie on `mesh`
    as `strategy_name` partitions them; the caller's model is not changed."""
    where = shardings(model, impl, mesh, strategy_name, config=config)
    w, found = _layers(model, impl, config)
    native = w.read(model, found)
    placed = {layer.name: {n: jax.device_put(a, where[layer.name][n])
                           for n, a in native[layer.name].items()} for layer in found}
    return library(impl).annotate_shardings(w.write(interface(impl).clone(model), placed, found))


def bytes_per_device(tree: Any) -> int:
    """The bytes of `tree`'s arrays held by one device (the largest shard of each array)."""
    total = 0
    for a in jax.tree.leaves(tree):
        if isinstance(a, jax.Array):
            total += math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize
    return total


def specs(tree: Any) -> Mapping[str, Any]:
    """The partition specs of `tree`'s arrays by key path (for reports and tests)."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(p): a.sharding.spec for p, a in flat
            if isinstance(a, jax.Array) and isinstance(a.sharding, NamedSharding)}
