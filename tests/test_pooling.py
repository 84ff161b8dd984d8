"""zoo.layers.pooling: non-overlapping max pools as a reshape and a max, equal to XLA's
reduce-window (Flax's and Equinox's pools) in value and gradient, ties included, and to
PyTorch's `max_pool3d`; every other pool is XLA's own."""

from __future__ import annotations

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import examples
from zoo.layers.eqx import MaxPool3d
from zoo.layers.pooling import max_pool, max_pool_axes, reshapes


def _value_and_grad(pool, x, g):
    """`pool(x)` and its input gradient for the cotangent `g`, as one compiled program."""

    def both(x, g):
        y, vjp = jax.vjp(pool, x)
        return y, vjp(g)[0]

    return jax.jit(both)(x, g)


def _ties(shape, seed=0):
    """Values from {-1, 0, 1, 2}: most windows hold several equal maxima."""
    return jnp.asarray(np.random.default_rng(seed).integers(-1, 3, shape), jnp.float32)


@pytest.mark.parametrize("window", [(2,), (2, 2), (2, 2, 2), (3, 1, 2)])
@pytest.mark.parametrize("values", ["random", "ties"])
def test_equals_flax_max_pool_value_and_gradient(window, values):
    shape = (2, *(4 * w for w in window), 3)
    x = jax.random.normal(jax.random.key(0), shape) if values == "random" else _ties(shape)
    pooled = (2, *(4 for _ in window), 3)
    g = jax.random.normal(jax.random.key(1), pooled)
    want = _value_and_grad(lambda x: nn.max_pool(x, window, window), x, g)
    got = _value_and_grad(lambda x: max_pool(x, window, window), x, g)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    # each window's cotangent reaches exactly one element (its first maximum)
    assert int(jnp.count_nonzero(got[1])) == int(jnp.count_nonzero(g))


def test_gradient_equals_torch_max_pool3d_with_ties():
    x = _ties((2, 3, 4, 6, 4), seed=1)  # (N, C, D, H, W)
    g = jax.random.normal(jax.random.key(2), (2, 3, 2, 3, 2))
    xt = torch.tensor(np.asarray(x), requires_grad=True)
    yt = torch.nn.functional.max_pool3d(xt, 2)
    yt.backward(torch.tensor(np.asarray(g)))
    pool = MaxPool3d(2, 2)
    y, dx = _value_and_grad(jax.vmap(pool), x, g)
    np.testing.assert_array_equal(y, yt.detach().numpy())
    np.testing.assert_array_equal(dx, xt.grad.numpy())


@settings(max_examples=examples(20), deadline=None)
@given(window=st.lists(st.integers(1, 3), min_size=1, max_size=3),
       counts=st.lists(st.integers(1, 3), min_size=3, max_size=3),
       seed=st.integers(0, 2**16))
def test_equals_equinox_pool_on_random_windows(window, counts, seed):
    n = len(window)
    x = _ties((2, *(w * c for w, c in zip(window, counts, strict=False))), seed)  # (C, *sp)
    reference = eqx.nn.Pool(-jnp.inf, jax.lax.max, n, window, window)
    got_pool = MaxPool3d(window, window) if n == 3 else None
    g = jax.random.normal(jax.random.key(seed), jax.eval_shape(reference, x).shape)
    want = _value_and_grad(reference, x, g)
    got = _value_and_grad(
        got_pool if got_pool is not None
        else (lambda x: max_pool(jnp.moveaxis(x, 0, -1), window, window).transpose(
            n, *range(n))), x, g)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("window", "strides", "padding"), [
    ((3, 3), (2, 2), "VALID"),   # overlapping windows (ResNet's stem)
    ((3, 3), (2, 2), ((1, 1), (1, 1))),
    ((2, 2), (2, 2), "SAME"),    # 5 is not a multiple of 2: padded
])
def test_other_pools_are_xla_reduce_window(window, strides, padding):
    x = _ties((2, 5, 5, 3))
    g_shape = nn.max_pool(x, window, strides, padding).shape
    g = jax.random.normal(jax.random.key(3), g_shape)
    want = _value_and_grad(lambda x: nn.max_pool(x, window, strides, padding), x, g)
    got = _value_and_grad(lambda x: max_pool(x, window, strides, padding), x, g)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    hlo = jax.jit(jax.grad(lambda x: max_pool(x, window, strides, padding).sum())).lower(
        x).as_text()
    assert "select_and_scatter" in hlo or "reduce_window" in hlo


def test_non_overlapping_gradient_has_no_reduce_window():
    x = jnp.ones((2, 8, 8, 8, 4))
    hlo = jax.jit(jax.grad(lambda x: max_pool(x, (2, 2, 2), (2, 2, 2)).sum())).lower(
        x).as_text()
    assert "reduce_window" not in hlo and "select_and_scatter" not in hlo
    assert reshapes((2, 8, 8, 8, 4), (2, 2, 2), (2, 2, 2), ((0, 0),) * 3, (1, 2, 3))
    assert not reshapes((2, 8, 8, 8, 4), (2, 2, 2), (1, 1, 1), ((0, 0),) * 3, (1, 2, 3))


def test_equinox_pool_checks_rank_and_keeps_ceil_mode():
    with pytest.raises(ValueError, match="rank 4"):
        MaxPool3d(2, 2)(jnp.ones((4, 4, 4)))
    x = _ties((2, 5, 5, 5))
    want = eqx.nn.MaxPool3d(2, 2, use_ceil=True)(x)
    np.testing.assert_array_equal(MaxPool3d(2, 2, use_ceil=True)(x), want)


def test_axes_in_any_order_pool_alike():
    x = _ties((2, 4, 6, 3), seed=4)
    g = jax.random.normal(jax.random.key(5), (2, 2, 2, 3))
    want = _value_and_grad(lambda x: nn.max_pool(x, (2, 3), (2, 3)), x, g)
    got = _value_and_grad(lambda x: max_pool_axes(x, (3, 2), None, None, (2, -3)), x, g)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
