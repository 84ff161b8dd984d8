"""Every pair of implementations computes the same function on converted weights.

Two facts together prove it for every architecture case and every ordered pair of JAX libraries
(src -> dst):
1. converting the src model into dst gives exactly the model `zoo.create` builds in dst from the
   same seed, since both write the same canonical state into dst's skeleton
   (`zoo/__init__.py`): tests/test_converters.py checks that every library's model reads
   back to that state bitwise (`test_round_trip_through_each_library_is_bitwise`, every case;
   `test_same_seed_gives_identical_models_everywhere`,
   `test_convert_between_every_pair_is_bitwise`);
2. the libraries' models, run once each, agree on forward outputs in training and evaluation
   (compiled in both modes, eagerly in evaluation; updated running statistics included),
   gradients with respect to the input and to every parameter, and 5 optimizer steps
   (parameters, statistics, then eval outputs), here.
Since the converted model *is* the dst model (1), comparing the libraries' models pairwise (2)
compares every converted pair, without running each converted pair again."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import converters
import zoo
from tests.conftest import CASE_IDS, CASES
from tests.kind_cover import cover, latin
from zoo.runtime import fast
from zoo.runtime.training import mse
from zoo.testing import assert_close, tolerance

TOL = tolerance("float32")
SEED = 3
CONFIGS = dict(zip(CASE_IDS, (c for _, c in CASES), strict=True))
# Agreement is symmetric: each unordered pair of libraries is compared once. A cover
# (tests.kind_cover): each case with one pair in turn (--exhaustive: every pair);
# every library is also held to PyTorch for every case (tests/test_torch_reference.py).
PAIRS = [pytest.param(a, b, id=f"{a}-{b}") for a, b in itertools.combinations(zoo.JAX_IMPLS, 2)]


@functools.cache
def _model(case: str, impl: str):
    return zoo.create(CONFIGS[case], impl, seed=SEED)


@functools.cache
def _forward(case: str, impl: str, train: bool, jit: bool):
    """Canonical-layout outputs and canonical state after one forward pass."""
    api, config = zoo.interface(impl), CONFIGS[case]
    static, params, state = api.split(_model(case, impl))
    f = functools.partial(api.apply, static, train=train)
    x = zoo.example_input(config, batch=3, seed=1)
    y, state = (jax.jit(f) if jit else f)(params, state, api.to_native(x, config))
    return (api.to_canonical(y, config),
            converters.to_canonical(api.merge(static, params, state), impl))


# Eager (op-by-op) execution in evaluation, compiled in both modes. Eager runs the model code
# as jit traces it, for every architecture alike: whole-model (tests.kind_cover, conftest).
# Each case runs every mode once, each with another pair, the pairs turning from case to case
# (--exhaustive: every pair in every mode). Every layer kind meets every library against
# PyTorch in the layer-rule tests (tests/test_layer_rules*.py, tests/test_attention_rules.py).
@pytest.mark.parametrize(("case", "train", "jit", "a", "b"), cover(CASE_IDS, latin([
    pytest.param(False, True, id="eval-jit"),
    pytest.param(False, False, id="eval-nojit", marks=pytest.mark.whole_model),
    pytest.param(True, True, id="train-jit")], PAIRS), per_case=3))
def test_forward_matches(case, train, jit, a, b):
    y_a, s_a = _forward(case, a, train, jit)
    y_b, s_b = _forward(case, b, train, jit)
    assert not np.allclose(y_a[0], y_a[1]), "an output that ignores the input proves nothing"
    assert_close(y_a, y_b)
    assert_close(s_a, s_b)  # includes updated running statistics


@functools.cache
def _gradients(case: str, impl: str):
    """Loss <y, cotangent> in training mode; gradients w.r.t. input (canonical; None for token
    ids) and params."""
    api, config = zoo.interface(impl), CONFIGS[case]
    static, params, state = api.split(_model(case, impl))
    x = zoo.example_input(config, batch=3, seed=2)
    cotangent = jax.random.normal(jax.random.key(7), _forward(case, impl, False, True)[0].shape)

    def loss(params, x):
        y, _ = api.apply(static, params, state, api.to_native(x, config), train=True)
        return jnp.sum(api.to_canonical(y, config) * cotangent)

    if not jnp.issubdtype(x.dtype, jnp.floating):  # integer inputs (tokens) have no gradient
        value, g_params = jax.jit(jax.value_and_grad(loss))(params, x)
        return value, None, converters.to_canonical(api.merge(static, g_params, state), impl)
    value, (g_params, g_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
    return value, g_x, converters.to_canonical(api.merge(static, g_params, state), impl)


@functools.cache
def _trained(case: str, impl: str, steps: int = 5):
    """Canonical state after `steps` SGD-with-momentum steps on a squared error, and the eval
    outputs of the trained model."""
    api, config = zoo.interface(impl), CONFIGS[case]
    xs = [zoo.example_input(config, batch=4, seed=10 + i) for i in range(steps)]
    shape = _forward(case, impl, False, True)[0].shape[1:]
    targets = [jax.random.normal(jax.random.key(20 + i), (4, *shape)) for i in range(steps)]
    step = fast.train_step(_model(case, impl), impl, optax.sgd(0.05, momentum=0.9), mse)
    for x, t in zip(xs, targets, strict=True):
        step(api.to_native(x, config), api.to_native(t, config))
    static, params, state = api.split(step.model())
    x = api.to_native(zoo.example_input(config, batch=3, seed=99), config)
    y, _ = jax.jit(functools.partial(api.apply, static, train=False))(params, state, x)
    return converters.to_canonical(step.model(), impl), api.to_canonical(y, config)


@pytest.mark.parametrize(("case", "a", "b"), cover(CASE_IDS, PAIRS))
def test_gradients_match(case, a, b):
    loss_a, gx_a, gp_a = _gradients(case, a)
    loss_b, gx_b, gp_b = _gradients(case, b)
    assert_close(loss_a, loss_b)
    assert_close(gx_a, gx_b)
    assert set(gp_a) == set(gp_b)
    assert_close(gp_a, gp_b)
    dead = [k for k, v in gp_a.items() if "weight" in k and not np.abs(np.asarray(v)).max()]
    assert not dead, f"zero gradients (dead units?) prove nothing: {dead}"


# Five optimizer steps are the gradients above plus optax's update and the running statistics
# (by layer kind): a whole model, so the kind cover's architectures run it, each with two pairs
# (all three libraries), the pairs turning; --exhaustive every case and pair.
@pytest.mark.whole_model
@pytest.mark.parametrize(("case", "a", "b"), cover(CASE_IDS, PAIRS, per_case=2))
def test_training_matches(case, a, b):
    state_a, y_a = _trained(case, a)
    state_b, y_b = _trained(case, b)
    start = converters.to_canonical(_model(case, a), a)
    moved = max(float(np.abs(np.asarray(state_a[k]) - np.asarray(start[k])).max())
                for k in start if "weight" in k)
    # Well above the tolerance, or agreeing after training would prove nothing.
    assert moved > 10 * TOL["atol"], f"training barely changed the parameters ({moved:.2g})"
    assert_close(state_a, state_b)
    assert_close(y_a, y_b)
