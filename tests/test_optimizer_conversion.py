"""Training checkpoints: parameters, BatchNorm statistics, optax state and step change library.

Every registered architecture trains with the zoo's one training step
(`zoo.runtime.fast.train_step`), resumed from a converted checkpoint in another library.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

import converters
import zoo
from converters import ConversionError, convert_file, read
from converters.core import from_canonical, to_canonical
from converters.optim import to_canonical_opt
from zoo.registry import skeleton
from zoo.runtime import fast
from zoo.runtime.training import LOSSES, targets
from zoo.testing import tolerance

CFG = zoo.make_config("cnn", features=(4, 8), hidden=16, input_size=(8, 8))
# Tolerance of "3 steps in Equinox + 3 in NNX == 6 in NNX", float32 on CPU. The first three steps
# run in a different library, so they agree to float rounding only (~1e-7 on the parameters).
# Adam's eps is 1e-4 because a conv feeding BatchNorm has a bias whose true gradient is zero,
# and Adam with eps=1e-8 would scale the ~1e-9 float noise of that gradient (which differs
# between libraries) into updates of ~lr.
ATOL = tolerance("float32")["atol"]


def optimizer() -> optax.GradientTransformation:
    return optax.adam(1e-3, eps=1e-4)


def batch(config: zoo.Config, seed: int = 1) -> tuple[jax.Array, jax.Array]:
    """32 canonical inputs and the architecture's targets."""
    x = zoo.example_input(config, batch=32, seed=seed)
    return x, targets(config, 32, jax.random.key(seed + 1))


def train(impl: str, model, tx, opt_state, steps: int, x, y):
    """`steps` optimizer steps of `zoo.runtime.fast.train_step`; returns (model, opt_state)."""
    api = zoo.interface(impl)
    config = converters.config_of(model, impl)
    target = y if config.LOSS == "cross_entropy" else api.to_native(y)
    step = fast.train_step(model, impl, tx, LOSSES[config.LOSS], opt_state=opt_state)
    for _ in range(steps):
        step(api.to_native(x), target)
    return step.model(), step.opt_state


def max_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64))))
               for k in a)


@pytest.mark.whole_model
@pytest.mark.parametrize("arch", zoo.ARCHS)
def test_three_eqx_steps_then_three_nnx_or_linen_steps_equal_six(arch, tmp_path):
    config, tx = zoo.tiny_config(arch), optimizer()
    start = zoo.canonical_init(config)
    x, y = batch(config)
    model, opt_state = train("eqx", from_canonical(start, config, "eqx"), tx, None, 3, x, y)
    src = converters.save(model, tmp_path / "run.eqx", "eqx", opt_state=opt_state, step=3)
    reference, _ = train("nnx", from_canonical(start, config, "nnx"), tx, None, 6, x, y)
    want = to_canonical(reference, "nnx")  # 6 steps in NNX from the same start
    for impl in ("nnx", "linen"):
        dst = tmp_path / f"run_{impl}"
        convert_file(src, dst, to=impl)  # through a checkpoint file in the target's format
        resumed, resumed_opt, step = converters.load(dst, impl, optimizer=tx)
        assert step == 3 and int(resumed_opt[0].count) == 3
        resumed, _ = train(impl, resumed, tx, resumed_opt, 3, x, y)
        got = to_canonical(resumed, impl)
        print(f"{arch} {impl}: max |6 steps - (3 eqx + 3 {impl})| = {max_diff(got, want):.2e}")
        assert max_diff(got, want) < ATOL, impl  # parameters and BatchNorm statistics
        assert max_diff(got, start) > 100 * ATOL  # it did train


def test_optimizer_state_round_trips_bitwise_through_every_format(tmp_path):
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3))
    x, y = batch(CFG)
    start = from_canonical(zoo.canonical_init(CFG), CFG, "nnx")
    model, opt_state = train("nnx", start, tx, None, 2, x, y)
    ck = converters.Checkpoint(CFG, {k: np.asarray(v) for k, v in
                                     to_canonical(model, "nnx").items()},
                               to_canonical_opt(opt_state, model, "nnx"), step=2)
    assert ck.optimizer.arrays["1/hyperparams/learning_rate"].dtype == np.float32
    path = converters.write(ck, tmp_path / "a_nnx", "nnx")
    for fmt, name in (("eqx", "b.eqx"), ("linen", "c_linen"), ("canonical", "d.safetensors"),
                      ("nnx", "e_nnx")):
        convert_file(path, tmp_path / name, to=fmt)
        path = tmp_path / name
        got = read(path)
        assert got.step == 2 and got.optimizer.layout == ck.optimizer.layout
        assert got.optimizer.arrays.keys() == ck.optimizer.arrays.keys()
        for k, v in ck.optimizer.arrays.items():
            assert got.optimizer.arrays[k].dtype == v.dtype
            assert got.optimizer.arrays[k].tobytes() == v.tobytes(), (fmt, k)
    # and the restored state plugs into the optimizer again, in each library
    for impl in ("eqx", "linen", "nnx"):
        model, opt, _step = converters.load(path, impl, optimizer=tx)
        params = zoo.interface(impl).split(model)[1]
        assert jax.tree.structure(opt) == jax.tree.structure(tx.init(params))
        mu = to_canonical(zoo.interface(impl).merge(*_with_params(model, impl, opt[1].inner_state
                                                                    [0].mu)), impl)
        np.testing.assert_array_equal(mu["fc1.weight"], ck.optimizer.arrays["1/inner_state/0/mu/"
                                                                            "fc1.weight"])


def _with_params(model, impl, params):
    static, _, state = zoo.interface(impl).split(model)
    return static, params, state


def test_written_training_checkpoints_restore_with_orbax_and_equinox_directly(tmp_path):
    import equinox as eqx

    tx = optax.adam(1e-3)
    ck = converters.Checkpoint(CFG, zoo.canonical_init(CFG))
    model = from_canonical(ck.state, CFG, "nnx")
    opt_state = tx.init(zoo.interface("nnx").split(model)[1])
    converters.save(model, tmp_path / "t_nnx", "nnx", opt_state=opt_state, step=5)
    for fmt, name in (("linen", "t_linen"), ("eqx", "t.eqx")):
        convert_file(tmp_path / "t_nnx", tmp_path / name, to=fmt)
    # NNX: restore into {"model": abstract state, "opt_state": abstract tx.init, "step": 0}
    from flax import nnx

    graphdef, abstract_state = nnx.split(skeleton(CFG, "nnx"))
    abstract_params = nnx.split(skeleton(CFG, "nnx"), nnx.Param, ...)[1]
    target = {"model": abstract_state, "opt_state": jax.eval_shape(tx.init, abstract_params),
              "step": 0}
    with ocp.StandardCheckpointer() as ckptr:
        restored = ckptr.restore((tmp_path / "t_nnx").absolute(), target)
    assert restored["step"] == 5 and int(restored["opt_state"][0].count) == 0
    assert to_canonical(nnx.merge(graphdef, restored["model"]), "nnx").keys() == ck.state.keys()
    # Linen: a TrainState-like dict {params, batch_stats, opt_state, step}
    _module, variables = skeleton(CFG, "linen")
    target = {**variables, "opt_state": jax.eval_shape(tx.init, variables["params"]), "step": 0}
    with ocp.StandardCheckpointer() as ckptr:
        restored = ckptr.restore((tmp_path / "t_linen").absolute(), target)
    assert restored["step"] == 5 and set(restored) == {"params", "batch_stats", "opt_state",
                                                       "step"}
    # Equinox: (model, opt_state, step) in one leaf file
    eq_model = skeleton(CFG, "eqx")
    eq_params = eqx.filter(from_canonical(ck.state, CFG, "eqx")[0], eqx.is_inexact_array)
    like = (eq_model, tx.init(eq_params), 0)
    with open(tmp_path / "t.eqx", "rb") as f:
        (m, state), opt, step = eqx.tree_deserialise_leaves(f, like)
    assert step == 5 and int(opt[0].count) == 0
    assert to_canonical((m, state), "eqx").keys() == ck.state.keys()


def test_unsupported_and_mismatched_optimizer_states(tmp_path):
    model = from_canonical(zoo.canonical_init(CFG), CFG, "linen")
    params = zoo.interface("linen").split(model)[1]
    with pytest.raises(ConversionError, match="neither a scalar"):
        to_canonical_opt({"noise": jnp.zeros((3, 4))}, model, "linen")
    converters.save(model, tmp_path / "sgd.safetensors", "canonical",
                    opt_state=optax.sgd(0.1, momentum=0.9).init(params), step=1)
    with pytest.raises(ConversionError, match="layout differs"):
        converters.load(tmp_path / "sgd.safetensors", "linen", optimizer=optax.adam(1e-3))
    model_only = converters.load(tmp_path / "sgd.safetensors", "linen", model_only=True)
    assert set(model_only[1]) == {"params", "batch_stats"}
    with pytest.raises(converters.CheckpointError, match="no optimizer state"):
        converters.load(tmp_path / "sgd.safetensors", model_only=True).opt_state("nnx")
