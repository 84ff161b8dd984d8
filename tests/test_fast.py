"""zoo.runtime.fast computes what the plain interface computes, for every JAX library, and
donates."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import zoo
from tests.kind_cover import cover
from zoo.bench.subjects import build_models, make_task
from zoo.runtime import fast
from zoo.runtime.training import LOSSES
from zoo.testing import assert_close

# zoo.runtime.fast is one mechanism over each library's interface: every architecture runs in one
# library in turn (--exhaustive: in all); every library meets every layer kind through it in
# tests/test_equivalence.py's training (the kind cover's architectures, in all three).
ARCHS = list(zoo.ARCHS)
tiny = zoo.tiny_config


@functools.cache
def case(arch: str):
    """(config, task, native models of every JAX impl from one canonical state)."""
    config = tiny(arch)
    task = make_task(config, 3, seed=1)
    return config, task, build_models(config, zoo.JAX_IMPLS, seed=0)


def reference_step(model, impl, optimizer, loss_fn, x, target, key=None):
    """One training step written out here, independent of `zoo.runtime.training.pure_step` (which
    `fast.train_step` wraps): the training-mode model's loss and its gradient by autodiff, one
    optax update; jitted whole (eagerly, it would compile op by op: slow). Returns (params,
    opt_state, state, loss)."""
    api = zoo.interface(impl)
    static, params, state = api.split(model)

    @jax.jit
    def step(params, state, x, target, key):
        def objective(params):
            y, new_state = api.apply(static, params, state, x, train=True, key=key)
            return loss_fn(y, target), new_state

        (loss, new_state), grads = jax.value_and_grad(objective, has_aux=True)(params)
        opt_state = optimizer.init(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, new_state, loss

    return step(params, state, x, target, key)


def jitted_apply(model, impl, train=False):
    """The plain interface's apply, jitted (an eager apply compiles op by op: slow)."""
    api = zoo.interface(impl)
    static, params, state = api.split(model)
    return jax.jit(lambda x: api.apply(static, params, state, x, train=train))


@pytest.mark.parametrize(("arch", "impl"), cover(ARCHS, zoo.JAX_IMPLS))
def test_forward_matches_interface(arch, impl):
    _, task, models = case(arch)
    api = zoo.interface(impl)
    x = api.to_native(task.x, task.config)
    want, _ = jitted_apply(models[impl], impl)(x)
    fwd = fast.forward(models[impl], impl)
    assert isinstance(fwd, fast.Forward) and fwd.impl == impl and not fwd.train
    # `lower` gives exactly the program a call runs.
    compiled = fwd.lower(x).compile()
    assert_close(fwd(x), want)
    assert_close(compiled(*fwd.args, x), want)


def test_donation_default_is_off_on_cpu_only():
    model = zoo.create(zoo.tiny_config("mlp"), "nnx")
    step = fast.train_step(model, "nnx", optax.sgd(0.1), lambda y, t: ((y - t) ** 2).mean())
    assert step.donate == (jax.default_backend() != "cpu")


@pytest.mark.parametrize(("arch", "impl"), cover(ARCHS, zoo.JAX_IMPLS))
def test_train_step_matches_reference_and_donates(arch, impl):
    _, task, models = case(arch)
    api = zoo.interface(impl)
    x = api.to_native(task.x, task.config)
    target = api.to_native(task.target, task.config) if task.loss == "mse" else task.target
    # Momentum SGD: an optimizer with a state, linear in the gradient (Adam's first step is
    # lr * sign(g): ulps of a near-zero gradient from another compilation would flip it).
    loss_fn, opt = LOSSES[task.loss], optax.sgd(1e-2, momentum=0.9)
    model = models[impl]
    before = [np.asarray(a) for a in jax.tree.leaves(api.split(model)[1])]

    step = fast.train_step(model, impl, opt, loss_fn, donate=True)
    held = step.leaves[0][0]
    loss = step(x, target)
    params, opt_state, state, want_loss = reference_step(model, impl, opt, loss_fn, x, target)

    assert_close(loss, want_loss)
    assert_close(step.params, params)
    assert_close(step.opt_state, opt_state)
    assert_close(step.state, state)
    # Donation (asked for; the default is off on CPU): the held buffers were given to the
    # step; the caller's model is untouched.
    assert held.is_deleted()
    after = [np.asarray(a) for a in jax.tree.leaves(api.split(model)[1])]
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    # The trained model comes back as a native model computing with the new arrays.
    trained = step.model()
    assert type(trained) is type(model)
    assert_close(api.split(trained)[1], params)


@pytest.mark.parametrize("impl", zoo.JAX_IMPLS)
def test_train_forward_returns_state(impl):
    """Training-mode forward: batch statistics used and returned (the CNN has BatchNorm)."""
    config = tiny("cnn")
    task = make_task(config, 3)
    model = build_models(config, (impl,))[impl]
    api = zoo.interface(impl)
    x = api.to_native(task.x, task.config)
    want_y, want_state = jitted_apply(model, impl, train=True)(x)
    y, new_state = fast.forward(model, impl, train=True)(x)
    assert len(jax.tree.leaves(new_state)) == 4
    assert_close(y, want_y)
    assert_close(new_state, want_state)


def test_libraries_train_identically():
    """Three steps of zoo.runtime.fast.train_step give the same losses in every library (CNN:
    BN)."""
    config = tiny("cnn")
    task = make_task(config, 4)
    models = build_models(config, zoo.JAX_IMPLS)
    losses = {}
    for impl, model in models.items():
        api = zoo.interface(impl)
        step = fast.train_step(model, impl, optax.sgd(0.1), LOSSES[task.loss])
        x = api.to_native(task.x, task.config)
        losses[impl] = [float(step(x, task.target)) for _ in range(3)]
    assert losses["eqx"][0] != losses["eqx"][2]
    for impl in zoo.JAX_IMPLS:
        assert_close(losses[impl], losses["eqx"])


@pytest.mark.parametrize("impl", ["nnx"])
def test_dropout_key(impl):
    config = tiny("cnn", dropout=0.5)
    task = make_task(config, 3)
    assert task.key is not None
    model = build_models(config, (impl,))[impl]
    api = zoo.interface(impl)
    x = api.to_native(task.x, task.config)
    step = fast.train_step(model, impl, optax.sgd(0.1), LOSSES[task.loss], donate=False)
    loss = step(x, task.target, task.key)
    *_, want = reference_step(model, impl, optax.sgd(0.1), LOSSES[task.loss], x,
                              task.target, task.key)
    assert_close(loss, want)


def test_bfloat16_and_non_zoo_models():
    """Any model the interface can split works, in any dtype (here a bare NNX layer)."""
    from flax import nnx

    layer = nnx.Linear(3, 2, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    x = jnp.ones((4, 3), jnp.bfloat16)
    assert fast.forward(layer, "nnx")(x).dtype == jnp.bfloat16
    step = fast.train_step(layer, "nnx", optax.sgd(0.1), lambda y, t: jnp.mean((y - t) ** 2))
    assert np.isfinite(float(step(x, jnp.zeros((4, 2), jnp.bfloat16))))


def test_rejects_torch():
    with pytest.raises(ValueError, match="no functional interface"):
        fast.forward(object(), "torch")


def _stacked_batches(config, impl, k):
    """K different batches in `impl`'s layout, stacked (leading axis K), and their list."""
    api = zoo.interface(impl)
    tasks = [make_task(config, 4, seed=10 + i) for i in range(k)]
    xs = [api.to_native(t.x, t.config) for t in tasks]
    ts = [api.to_native(t.target, t.config) if t.loss == "mse" else t.target for t in tasks]
    return xs, ts, tasks[0].loss


@pytest.mark.parametrize("impl", zoo.JAX_IMPLS)
@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_fused_steps_equal_single_steps(arch, impl):
    """K = 3 fused steps == 3 single steps: parameters, optimizer and BN state, losses.

    MLP (Adam): bitwise on CPU, where the scan body compiles to the single step's program. CNN
    (BatchNorm + dropout, one key per step): within the float32 tolerance (XLA fuses the conv
    gradients differently inside the loop; Adam would amplify those ulps near zero gradients, so
    plain SGD is used)."""
    k = 3
    config = tiny(arch, dropout=0.5) if arch == "cnn" else tiny(arch)
    model = build_models(config, (impl,))[impl]
    xs, ts, loss = _stacked_batches(config, impl, k)
    keys = jax.random.split(jax.random.key(7), k) if arch == "cnn" else None
    opt = optax.adam(1e-2) if arch == "mlp" else optax.sgd(0.1)
    single = fast.train_step(model, impl, opt, LOSSES[loss])
    want = [single(xs[i], ts[i], *(() if keys is None else (keys[i],))) for i in range(k)]
    fused = fast.train_step(model, impl, opt, LOSSES[loss], steps_per_call=k)
    got = fused(jnp.stack(xs), jnp.stack(ts), keys)
    assert got.shape == (k,) and fused.steps_per_call == k
    assert float(got[0]) != float(got[-1])  # the steps did train
    if arch == "mlp" and jax.default_backend() == "cpu":
        for a, b in zip(jax.tree.leaves((want, single.leaves)),
                        jax.tree.leaves((list(got), fused.leaves)), strict=True):
            np.testing.assert_array_equal(a, b)
        unrolled = fast.train_step(model, impl, opt, LOSSES[loss], steps_per_call=k, unroll=True)
        assert_close(unrolled(jnp.stack(xs), jnp.stack(ts)), jnp.stack(want))
    else:
        assert_close(got, jnp.stack(want))
        assert_close(fused.leaves, single.leaves)
    if arch == "cnn":
        assert len(jax.tree.leaves(fused.state)) == 4  # BN statistics carried through the scan


def test_fused_steps_reject_bad_input():
    model = zoo.create(tiny("mlp"), "eqx")
    loss_fn = lambda y, t: jnp.mean(y ** 2)
    with pytest.raises(ValueError, match="steps_per_call must be a positive int"):
        fast.train_step(model, "eqx", optax.sgd(0.1), loss_fn, steps_per_call=0)
    step = fast.train_step(model, "eqx", optax.sgd(0.1), loss_fn, steps_per_call=2)
    x = jnp.ones((3, 4, *tiny("mlp").input_shape))
    with pytest.raises(ValueError, match=r"^x: steps_per_call=2 needs a leading axis of 2"):
        step(x, x)
