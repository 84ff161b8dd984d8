"""The interface's whole-model operations on models the zoo did not build: `forward` / `eval_fn`
run a user's model (no `train=` / `key=` in its `__call__`) in eval mode without changing it,
`clone` copies what writing into would change, `checkpoint_tree` is what the library stores."""

from __future__ import annotations

import importlib.util

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import zoo
from zoo.libraries import library, native_interface
from zoo.testing import assert_close

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def test_eqx_mlp_of_the_user():
    mlp = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, 3))
    y = zoo.interface("eqx").forward(mlp, x)
    assert_close(y, jax.vmap(mlp)(x))


class _NoKey(eqx.Module):
    """A user's Equinox model whose `__call__` takes no `key=`, with BatchNorm state."""

    linear: eqx.nn.Linear
    norm: eqx.nn.BatchNorm

    def __init__(self, key):
        self.linear = eqx.nn.Linear(3, 2, key=key)
        self.norm = eqx.nn.BatchNorm(2, axis_name="batch", mode="ema")

    def __call__(self, x, state):
        return self.norm(self.linear(x), state)


def test_eqx_stateful_model_without_key_runs_inference():
    model, state = eqx.nn.make_with_state(_NoKey)(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (5, 3))
    y = zoo.interface("eqx").forward((model, state), x)
    # inference: the running statistics normalise, not the batch's
    inference = eqx.nn.inference_mode(model)
    expected = jax.vmap(lambda xi: inference(xi, state)[0], axis_name="batch")(x)
    assert_close(y, expected)
    assert float(jnp.abs(y.mean(0)).max()) > 1e-3  # batch statistics would centre it
    assert model.norm.inference is False  # the caller's model is not switched


class _LinenCNN(nn.Module):
    """A user's Linen MNIST-style CNN: no `train` argument."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3))(x))
        return nn.Dense(3)(x.reshape(x.shape[0], -1))


def test_linen_module_without_train():
    module = _LinenCNN()
    x = jax.random.normal(jax.random.key(1), (2, 6, 6, 1))
    variables = module.init(jax.random.key(0), x)
    api = zoo.interface("linen")
    y = api.forward((module, variables), x)
    assert_close(y, module.apply(variables, x))
    assert y.shape == (2, 3)
    assert api.checkpoint_tree((module, variables)) is variables


class _NNXNet(nnx.Module):
    """An NNX tutorial-style model with BatchNorm and Dropout, `__call__(x)` only."""

    def __init__(self, rngs):
        self.linear = nnx.Linear(3, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.drop(self.bn(self.linear(x)))


def test_nnx_model_stays_in_train_mode():
    model = _NNXNet(nnx.Rngs(0))
    before = jax.tree.map(np.asarray, nnx.state(model, nnx.BatchStat))
    x = jax.random.normal(jax.random.key(1), (6, 3)) + 2.0
    y = zoo.interface("nnx").forward(model, x)
    reference = nnx.clone(model)
    reference.eval()
    assert_close(y, reference(x))
    # the caller's model: still training, statistics untouched
    assert model.bn.use_running_average is False and model.drop.deterministic is False
    after = nnx.state(model, nnx.BatchStat)
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, after))
    train_y = model(x)  # batch statistics and dropout: a different output
    # tolerance: must differ, by far more than rounding
    assert not np.allclose(train_y, y, atol=1e-3)


def test_eval_fn_traces_a_skeleton():
    """`eval_fn` is pure: an abstract skeleton traces, batched, in the native layout."""
    skel = eqx.filter_eval_shape(eqx.nn.MLP, 12, 2, 8, 1, key=jax.random.key(0))
    fn, arrays = zoo.interface("eqx").eval_fn(skel)
    out = jax.eval_shape(fn, arrays, jax.ShapeDtypeStruct((3, 12), jnp.float32))
    assert out.shape == (3, 2)


def test_clone_and_layout():
    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    copy = zoo.interface("nnx").clone(model)
    copy.kernel[...] = copy.kernel[...] + 1
    assert not np.allclose(model.kernel[...], copy.kernel[...])
    mlp = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
    assert zoo.interface("eqx").clone(mlp) is mlp  # immutable: its own copy
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    for impl in ("eqx", "linen", "nnx", "torch"):
        api = native_interface(impl)
        assert api.channels_last == library(impl).channels_last
        np.testing.assert_array_equal(api.to_canonical(api.to_native(x)), x)


def test_torch_has_no_functional_interface():
    with pytest.raises(ValueError, match="no functional interface"):
        zoo.interface("torch")
    with pytest.raises(NotImplementedError):
        native_interface("torch").split(object())


@pytest.mark.skipif(not HAVE_TORCH, reason="needs PyTorch")
def test_torch_forward_in_eval_mode_on_a_copy():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Dropout(0.5))
    x = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32) + 2
    api = native_interface("torch")
    y = api.forward(model, x)
    assert model.training  # the caller's module is still training
    with torch.no_grad():
        expected = model[0](torch.from_numpy(x)).numpy() / np.sqrt(1 + model[1].eps)
    assert_close(y, expected)
    copy = api.clone(model)
    with torch.no_grad():
        copy[0].weight.add_(1)
    assert not torch.allclose(copy[0].weight, model[0].weight)
    assert set(api.checkpoint_tree(model)) == set(model.state_dict())
