"""Every pair of implementations computes the same function on converted weights.

For every architecture case and every ordered pair of JAX libraries (src -> dst): forward outputs
in training and evaluation (with and without jit), gradients with respect to the input and to
every parameter, and 5 optimizer steps (parameters, BatchNorm statistics, then eval outputs).
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

import converters
import zoo
from tests.conftest import CASE_IDS, CASES, PAIR_IDS, PAIRS
from zoo import fast
from zoo.testing import tolerance
from zoo.training import mse

TOL = tolerance("float32")


def _apply(impl, model, x, *, train, key=None, jit=True):
    """Canonical-layout output and the new model of one forward pass."""
    api = zoo.interface(impl)
    static, params, state = api.split(model)
    f = functools.partial(api.apply, static, train=train, key=key)
    y, state = (jax.jit(f) if jit else f)(params, state, api.to_native(x))
    return api.to_canonical(y), api.merge(static, params, state)


def _loss_and_grads(impl, model, x, cotangent):
    """Loss <y, cotangent> in training mode; gradients w.r.t. input (canonical) and params."""
    api = zoo.interface(impl)
    static, params, state = api.split(model)

    def loss(params, x):
        y, _ = api.apply(static, params, state, api.to_native(x), train=True)
        return jnp.sum(api.to_canonical(y) * cotangent)

    value, (g_params, g_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
    return value, g_x, converters.to_canonical(api.merge(static, g_params, state), impl)


def _train(impl, model, xs, targets, steps=5):
    """`steps` SGD-with-momentum steps on a squared error; returns the final native model."""
    api = zoo.interface(impl)
    step = fast.train_step(model, impl, optax.sgd(0.05, momentum=0.9), mse)
    for i in range(steps):
        step(api.to_native(xs[i]), api.to_native(targets[i]))
    return step.model()


def _output_shape(impl, model, x):
    return _apply(impl, model, x, train=False)[0].shape


CONFIGS = dict(zip(CASE_IDS, (c for _, c in CASES), strict=True))


@functools.cache
def _converted(case: str, src: str, dst: str):
    """The `src` model of a case (seed 3), converted into `dst`."""
    model = zoo.create(CONFIGS[case], src, seed=3)
    return model if src == dst else converters.convert(model, src, dst)


FORWARD_PARAMS = [
    (f"{case}_{pid}_{'train' if train else 'eval'}", case, src, dst, train)
    for case in CASE_IDS
    for pid, (src, dst) in zip(PAIR_IDS, PAIRS, strict=True)
    for train in (False, True)
]


class ForwardTest(chex.TestCase):
    """Forward outputs (and updated statistics) match, jitted and not jitted."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*FORWARD_PARAMS)
    def test_forward(self, case, src, dst, train):
        config = CONFIGS[case]
        model_src, model_dst = _converted(case, src, src), _converted(case, src, dst)
        x = zoo.example_input(config, batch=3, seed=1)
        outs = []
        for impl, model in ((src, model_src), (dst, model_dst)):
            api = zoo.interface(impl)
            static, params, state = api.split(model)
            f = self.variant(functools.partial(api.apply, static, train=train))
            y, state = f(params, state, api.to_native(x))
            outs.append((api.to_canonical(y),
                         converters.to_canonical(api.merge(static, params, state), impl)))
        (y_src, s_src), (y_dst, s_dst) = outs
        self.assertFalse(np.allclose(y_src[0], y_src[1]),
                         "an output that ignores the input would prove nothing")
        chex.assert_trees_all_close(y_src, y_dst, **TOL)
        chex.assert_trees_all_close(s_src, s_dst, **TOL)  # includes updated running statistics


@functools.cache
def _gradients(case: str, src: str, dst: str):
    config, model = CONFIGS[case], _converted(case, src, dst)
    x = zoo.example_input(config, batch=3, seed=2)
    cotangent = jax.random.normal(jax.random.key(7), _output_shape(dst, model, x))
    return _loss_and_grads(dst, model, x, cotangent)


@functools.cache
def _trained(case: str, src: str, dst: str):
    """Canonical state after 5 steps, and eval outputs of the trained model."""
    config, model = CONFIGS[case], _converted(case, src, dst)
    xs = [zoo.example_input(config, batch=4, seed=10 + i) for i in range(5)]
    shape = _output_shape(dst, model, xs[0])
    targets = [jax.random.normal(jax.random.key(20 + i), shape) for i in range(5)]
    trained = _train(dst, model, xs, targets)
    y, _ = _apply(dst, trained, zoo.example_input(config, batch=3, seed=99), train=False)
    return converters.to_canonical(trained, dst), y


# Gradients and training run once per (case, library): the src model of each pair is run as
# created, the dst model as converted from it, and the conversion itself is checked bitwise.
@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("case", CASE_IDS)
def test_gradients_match(case, src, dst):
    loss_src, gx_src, gp_src = _gradients(case, src, src)
    loss_dst, gx_dst, gp_dst = _gradients(case, src, dst)
    chex.assert_trees_all_close(loss_src, loss_dst, **TOL)
    chex.assert_trees_all_close(gx_src, gx_dst, **TOL)
    assert set(gp_src) == set(gp_dst)
    chex.assert_trees_all_close(gp_src, gp_dst, **TOL)
    dead = [k for k, v in gp_src.items() if "weight" in k and not np.abs(np.asarray(v)).max()]
    assert not dead, f"zero gradients (dead units?) prove nothing: {dead}"


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("case", CASE_IDS)
def test_training_matches(case, src, dst):
    state_src, y_src = _trained(case, src, src)
    state_dst, y_dst = _trained(case, src, dst)
    start = converters.to_canonical(_converted(case, src, src), src)
    moved = max(float(np.abs(np.asarray(state_src[k]) - np.asarray(start[k])).max())
                for k in start if "weight" in k)
    assert moved > 1e-3, "training did not change the parameters"
    chex.assert_trees_all_close(state_src, state_dst, **TOL)
    chex.assert_trees_all_close(y_src, y_dst, **TOL)
