"""Sharding (zoo.runtime.sharding): logical axes per layer kind, the strategies, Linen's logical
partitioning and Equinox's `filter_shard` on the zoo's names, and a training step on 8 CPU
devices under dp, fsdp and tp equal to one device and across the libraries
(tests/sharding_worker.py, a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

import canonical
import zoo
import zoo.runtime.fast
from canonical.kinds import KINDS
from tests.kind_cover import covering_archs, features
from zoo.registry import skeleton, walk_facts
from zoo.runtime import precision, sharding
from zoo.runtime.training import LOSSES, targets
from zoo.testing import assert_close

ZOO_ARCHS = [a for a in zoo.ARCHS if zoo.architecture(a).config.__module__.startswith("zoo.")]
CASES = [(a, i) for a in ZOO_ARCHS for i in zoo.JAX_IMPLS if zoo.architecture(a).has(i)]
MESH = AbstractMesh((8, 2), (sharding.DATA, sharding.MODEL))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("arch,impl", CASES)
def test_every_array_of_a_kind_with_axes_is_named(arch, impl):
    """Each native array of a layer whose kind has an axes table for the family is in it, with
    as many axes as dimensions (a table missing an array would leave it silently replicated)."""
    cfg = zoo.tiny_config(arch)
    model = skeleton(cfg, impl)  # abstract arrays: their ranks are all the axes need
    family = canonical.walker(impl).family
    found = {layer.name: layer.kind for layer in
             canonical.layers(model, impl, **walk_facts(cfg, impl))}
    named = 0
    for layer, arrays in sharding.logical_axes(model, impl, cfg).items():
        table = KINDS[found[layer]].axes.get(family)
        for name, axes in arrays.items():
            if table is not None:
                assert name in table, f"{found[layer]} kind: no axes for {family} {name!r}"
                assert any(a is not None for a in axes)
                named += 1
    assert named > 0


def test_logical_axes_refuse_a_table_that_does_not_fit():
    with pytest.raises(ValueError, match=r"linear kind: logical axes .* rank 3"):
        KINDS["linear"].logical_axes("flax", "kernel", 3)
    assert KINDS["conv"].logical_axes("flax", "kernel", 5) == (
        None, None, None, "conv_in", "conv_out")
    assert KINDS["conv"].logical_axes("eqx", "bias", 3) == ("conv_out", None, None)
    assert KINDS["parameter"].logical_axes("eqx", "", 3) == (None, None, None)


@pytest.mark.parametrize("name,axes,shape,expected", [
    ("dp", ("embed", "mlp"), (64, 128), PartitionSpec(None, None)),
    ("fsdp", ("embed", "mlp"), (64, 128), PartitionSpec(None, "data")),   # the largest
    ("fsdp", ("embed", "mlp"), (64, 12), PartitionSpec("data", None)),    # the one divisible
    ("fsdp", ("embed", "mlp"), (6, 12), PartitionSpec(None, None)),       # none: replicated
    ("fsdp", (None, None), (64, 64), PartitionSpec(None, None)),          # unnamed axes
    ("tp", ("embed", "heads", "kv"), (64, 4, 16), PartitionSpec(None, "model", None)),
    ("tp", ("embed", "mlp"), (64, 3), PartitionSpec(None, None)),         # 2 does not divide 3
])
def test_strategy_specs(name, axes, shape, expected):
    assert sharding.strategy(name).spec(axes, shape, MESH) == expected


def test_bad_strategy_mesh_or_library_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"unknown sharding strategy 'zero3'.*'fsdp'"):
        sharding.strategy("zero3")
    mesh = jax.make_mesh((1,), (sharding.DATA,))
    with pytest.raises(ValueError, match=r"strategy 'tp' needs mesh axes .*missing \['model'\]"):
        zoo.create("mlp", "nnx", mesh=mesh, strategy="tp", **zoo.tiny_config("mlp").TINY)
    with pytest.raises(ValueError, match="impl='torch' is not a JAX library"):
        sharding.shard(object(), "torch", mesh, config=zoo.tiny_config("mlp"))


@pytest.mark.parametrize("impl", list(zoo.JAX_IMPLS))
def test_one_device_mesh_computes_what_no_mesh_computes(impl):
    """In the test process (one device): the same numbers with and without `mesh=`, and the
    caller's model untouched."""
    cfg = zoo.tiny_config("cnn")
    mesh = jax.make_mesh((1,), (sharding.DATA,))
    plain = zoo.create(cfg, impl)
    placed = zoo.create(cfg, impl, mesh=mesh, strategy="fsdp")
    facts = walk_facts(cfg, impl)
    chex.assert_trees_all_equal(canonical.read(placed, impl, **facts),
                                canonical.read(plain, impl, **facts))
    api = zoo.interface(impl)
    x = api.to_native(zoo.example_input(cfg, 4))
    t = targets(cfg, 4, jax.random.key(1))
    losses = [float(zoo.runtime.fast.train_step(m, impl, optax.sgd(0.1), LOSSES[cfg.LOSS],
                                                mesh=mesh_)(x, t))
              for m, mesh_ in ((plain, None), (placed, mesh))]
    assert_close(losses[1], losses[0])


@pytest.mark.parametrize("arch", ["vit", "cnn"])
@pytest.mark.parametrize("name", ["dp", "tp"])
def test_linen_logical_partitioning_gives_the_shardings_the_zoo_places(arch, name):
    """Linen's own idiom on the zoo's names: the variables boxed as `nn.LogicallyPartitioned`,
    `nn.get_partition_spec` and `nn.logical_to_mesh_sharding` with the strategy's rules give
    every array the sharding `zoo.runtime.sharding.shardings` gives it, and the batch its split (an
    even class count: Flax's rules do not look at sizes, see the next test)."""
    from flax import linen as nn

    cfg = zoo.make_config(arch, **{**zoo.tiny_config(arch).TINY, "num_classes": 6})
    model = zoo.create(cfg, "linen")
    module, boxed = sharding.logically_named(model, "linen", config=cfg)
    rules = sharding.logical_rules(name)
    theirs = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), MESH, rules)
    found = canonical.layers(model, "linen", **walk_facts(cfg, "linen"))
    theirs = canonical.walker("linen").read((module, theirs), found)
    ours = sharding.shardings(model, "linen", MESH, name, config=cfg)
    assert theirs.keys() == ours.keys()
    split = 0
    for layer, arrays in ours.items():
        assert theirs[layer].keys() == arrays.keys(), layer
        for n, where in arrays.items():
            assert theirs[layer][n].spec == where.spec, (layer, n)
            split += sharding.MODEL in where.spec
    assert split > 0 if name == "tp" else split == 0
    batch = nn.logical_to_mesh_sharding(PartitionSpec(sharding.BATCH), MESH, rules)
    assert batch.spec == sharding.batch_sharding(MESH).spec


def test_flax_rules_and_the_zoo_differ_where_a_dimension_does_not_divide():
    """5 classes over a model axis of 2: the zoo replicates, Flax's rule would split."""
    from flax import linen as nn

    tp = sharding.strategy("tp")
    assert tp.spec(("embed", "mlp"), (8, 5), MESH) == PartitionSpec(None, None)
    assert nn.logical_to_mesh_axes(("embed", "mlp"), tp.logical_rules()) == PartitionSpec(
        None, sharding.MODEL)


def test_logically_named_linen_variables_apply_as_the_plain_ones():
    """`module.apply` unboxes the boxes (BatchNorm statistics included); `nn.unbox` gives the
    variables back; the caller's model is not changed. fsdp has no rule table, and a library
    without a box says so, each in one line."""
    from flax import linen as nn

    cfg = zoo.tiny_config("cnn")
    module, variables = zoo.create(cfg, "linen")
    before = jax.tree.map(np.asarray, variables)
    _, boxed = sharding.logically_named((module, variables), "linen", config=cfg)
    leaves = jax.tree.leaves(boxed, is_leaf=lambda a: isinstance(a, nn.LogicallyPartitioned))
    assert leaves and all(isinstance(a, nn.LogicallyPartitioned) for a in leaves)
    assert {"conv_out", "channels", "mlp"} <= {n for a in leaves for n in a.names}
    x = zoo.interface("linen").to_native(zoo.example_input(cfg, 2))
    chex.assert_trees_all_equal(module.apply(boxed, x), module.apply(variables, x))
    chex.assert_trees_all_equal(nn.unbox(boxed), variables)
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, variables), before)
    with pytest.raises(ValueError, match=r"'fsdp' has no logical axis rules: .* per array"):
        sharding.logical_rules("fsdp")
    with pytest.raises(ValueError, match=r"impl='eqx' has no box for logical axis names"):
        sharding.logically_named(zoo.create(cfg, "eqx"), "eqx", config=cfg)


@pytest.mark.parametrize("impl", list(zoo.JAX_IMPLS))
def test_a_mesh_step_splits_the_batch_with_its_library_constraint(impl, monkeypatch):
    """`train_step(..., mesh=)` constrains `x` and `target` with `Library.constrain` (its
    library's idiom), to the batch's split over "data"."""
    cls = type(zoo.libraries.library(impl))
    real, seen = cls.constrain, []

    def spy(self, tree, where):
        seen.append((jax.tree.map(lambda a: a.shape, tree), where))
        return real(self, tree, where)

    monkeypatch.setattr(cls, "constrain", spy)
    cfg = zoo.tiny_config("mlp")
    mesh = jax.make_mesh((1,), (sharding.DATA,))
    api = zoo.interface(impl)
    x = api.to_native(zoo.example_input(cfg, 4))
    t = targets(cfg, 4, jax.random.key(1))
    zoo.runtime.fast.train_step(zoo.create(cfg, impl), impl, optax.sgd(0.1), LOSSES[cfg.LOSS],
                        mesh=mesh)(x, t)
    assert [shape for shape, _ in seen] == [x.shape, t.shape]
    assert all(where == sharding.batch_sharding(sharding.auto(mesh)) for _, where in seen)


def test_equinox_constrains_with_filter_shard(monkeypatch):
    """Equinox's `constrain` is `eqx.filter_shard` (array leaves constrained, others passed
    through), the idiom of Equinox's own sharding example."""
    import equinox as eqx

    calls = []
    real = eqx.filter_shard
    monkeypatch.setattr(eqx, "filter_shard", lambda x, s: calls.append(s) or real(x, s))
    where = sharding.replicated(jax.make_mesh((1,), (sharding.DATA,)))
    tree = (jnp.ones(3), "static", None)
    out = jax.jit(lambda a: zoo.libraries.EQX.constrain((a, "static", None), where)[0])(tree[0])
    assert calls == [where] and out.sharding.is_equivalent_to(where, 1)
    assert zoo.libraries.EQX.constrain(tree, where)[1:] == ("static", None)


@pytest.mark.parametrize("impl", zoo.JAX_IMPLS)
def test_expert_parallelism_splits_the_stacked_experts_only(impl):
    """`ep`: a mixture's experts (their leading "expert" axis) over "model", every other array
    replicated (the batch goes over "data")."""
    cfg = zoo.tiny_config("mixtral")
    where = sharding.shardings(skeleton(cfg, impl), impl, AbstractMesh((4, 2), (
        sharding.DATA, sharding.MODEL)), "ep", config=cfg)
    specs = {f"{layer}.{name}": s.spec for layer, arrays in where.items()
             for name, s in arrays.items()}
    experts = {k for k in specs if ".experts." in k}
    assert len(experts) == 2 * cfg.num_hidden_layers
    assert all(specs[k] == PartitionSpec(sharding.MODEL, None, None) for k in experts)
    assert all(specs[k] == PartitionSpec(*[None] * len(specs[k])) for k in specs
               if k not in experts)


@pytest.fixture(scope="module")
def report(request):
    env = {**os.environ, "PYTHONPATH": ROOT}
    every = ["--exhaustive"] if request.config.getoption("--exhaustive") else []
    done = subprocess.run([sys.executable, "-m", "tests.sharding_worker", *every], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_eight_devices_train_as_one(report, request):
    """The architectures covering every layer kind, loss and input (`tests.kind_cover`): one
    step on 8 devices under fsdp (dp, which splits the batch as fsdp does and replicates the
    parameters, until every library has met it; and tp on a 4x2 mesh where there are heads or a
    vocabulary: the language models' q/k/v, MLP and embedding split over "model"; ep on 4x2
    where there are experts: a mixture's stacked experts split over "model") equals the
    first library's step on one device (loss, updated parameters, BatchNorm statistics: global
    batch statistics). Each architecture meets each strategy in one library, the libraries
    in turn, so every library meets every strategy (`--exhaustive`: every library)."""
    assert report["devices"] == 8
    tol = precision.tolerance("float32")
    cases = {(s["arch"], s["impl"], s["strategy"]) for s in report["steps"]}
    covered = covering_archs(tuple(ZOO_ARCHS))
    assert set().union(*map(features, covered)) == set().union(*map(features, ZOO_ARCHS))
    assert {s["arch"] for s in report["steps"]} == set(covered)
    for arch in covered:
        assert "fsdp" in {s for a, _, s in cases if a == arch}, arch
    assert {s for *_, s in cases} == {"dp", "fsdp", "tp", "ep"}
    for name in ("dp", "fsdp", "tp", "ep"):
        assert {i for _, i, s in cases if s == name} == set(zoo.JAX_IMPLS), name
    if request.config.getoption("--exhaustive"):
        for arch, impl in CASES:
            if arch in covered:
                assert {(arch, impl, "dp"), (arch, impl, "fsdp")} <= cases, (arch, impl)
    for s in report["steps"]:
        where = f"{s['arch']} {s['impl']} {s['strategy']}"
        assert s["loss_diff"] <= tol, where
        assert s["state_diff"] <= tol, where
        assert s["bytes_per_device"] <= s["bytes_one_device"], where
        if s["strategy"] == "dp":
            assert s["bytes_per_device"] == s["bytes_one_device"], where


@pytest.mark.exhaustive
def test_libraries_train_alike_under_each_strategy(report):
    """Under each strategy, the libraries' sharded steps equal each other (every pair: loss
    and canonical state), not only each the one-device step (the default run shows it through
    the one-device step, which each library's sharded step equals)."""
    tol = precision.tolerance("float32")
    rows = {(r["arch"], r["strategy"]): r for r in report["libraries"]}
    steps = {(s["arch"], s["strategy"]) for s in report["steps"]}
    assert rows.keys() == steps
    for (arch, name), r in rows.items():
        assert set(r["impls"]) == {i for a, i in CASES if a == arch}, (arch, name)
        assert len(r["impls"]) > 1, (arch, name)
        assert r["loss_diff"] <= tol, (arch, name)
        assert r["state_diff"] <= tol, (arch, name)


def test_fsdp_divides_parameter_and_optimizer_bytes_by_the_devices(report):
    """On the arrays' shardings: dp holds everything on every device, fsdp an eighth (the MLP's
    dims are all divisible by 8; the optimizer's step counter stays replicated)."""
    memory = report["memory"]
    for impl in zoo.JAX_IMPLS:
        one, dp, fsdp = (memory[f"{impl}/{k}"] for k in ("one", "dp", "fsdp"))
        assert dp == one
        assert one / 8 <= fsdp <= one / 8 + 64, (impl, one, fsdp)


def test_each_library_constraint_splits_a_batch_over_the_devices(report):
    """`Library.constrain` (Equinox: `eqx.filter_shard`) inside `jax.jit` puts a replicated
    batch on its split over the 8 devices."""
    assert report["constrained"] == {impl: "P('data',)" for impl in zoo.JAX_IMPLS}


def test_nnx_partition_specs_read_where_the_arrays_lie(report):
    """An NNX model on a mesh says where its arrays lie the way Flax's guide reads it:
    `nnx.get_partition_spec(nnx.state(model))`, from each Variable's metadata."""
    specs = report["nnx_partition_specs"]
    assert specs and any("data" in placed for placed, _ in specs.values()), specs
    assert all(placed == read for placed, read in specs.values()), specs


@pytest.fixture(scope="module")
def orbax_report(tmp_path_factory, request):
    env = {**os.environ, "PYTHONPATH": ROOT}
    scratch = tmp_path_factory.mktemp("orbax-sharded")
    every = ["--exhaustive"] if request.config.getoption("--exhaustive") else []
    done = subprocess.run([sys.executable, "-m", "tests.orbax_sharding_worker", str(scratch),
                           *every], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _orbax_cases(rows: list[dict], request) -> None:
    """Every library and both models (the ViT, Llama) ran; every pair with `--exhaustive`."""
    ran = {(r["arch"], r["impl"]) for r in rows}
    assert {i for _, i in ran} == set(zoo.JAX_IMPLS)
    assert {a for a, _ in ran} == {"vit", "llama"}
    if request.config.getoption("--exhaustive"):
        assert ran == {(a, i) for a in ("vit", "llama") for i in zoo.JAX_IMPLS}


def test_orbax_checkpoint_of_eight_devices_restores_onto_two_and_one(orbax_report, request):
    """A model sharded over 8 devices (fsdp) in each JAX library, the ViT and a language model
    (Llama) in turn, saved as orbax (each device writing its shards: orbax's `_sharding`
    record is there), is restored by
    `converters.load(..., mesh=, strategy="fsdp")` onto 2 devices and onto 1 with every array
    exactly as it was, lying on that mesh, each device holding its part."""
    assert orbax_report["devices"] == 8
    rows = orbax_report["restored"]
    _orbax_cases(rows, request)
    assert {r["format"] for r in rows} == {"linen", "nnx"}
    for r in rows:
        where = f"{r['arch']} {r['impl']} as {r['format']} onto {r['devices']}"
        assert r["sharding_file"], where
        assert r["diff"] == 0.0, where
        assert r["on"] == [r["devices"]], where
    for arch, impl in {(r["arch"], r["impl"]) for r in rows}:
        nbytes = {r["devices"]: r["bytes_per_device"] for r in rows
                  if (r["arch"], r["impl"]) == (arch, impl)}
        assert nbytes[2] < 0.75 * nbytes[1], (arch, impl, nbytes)


def test_orbax_checkpoint_of_eight_devices_converts_to_torch(orbax_report, request):
    """`python -m converters convert CKPT OUT.pt --to torch` on the 8-device checkpoints: the
    PyTorch model computes what the sharded JAX model computed."""
    rows = orbax_report["torch"]
    _orbax_cases(rows, request)
    for r in rows:
        assert r["status"] == 0, r
        assert r["diff"] <= precision.tolerance("float32") * max(1.0, r["scale"]), r
