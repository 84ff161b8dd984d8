"""zoo.layers.activations.gelu: PyTorch's exact GELU, values and gradients, in the cheaper
formulation (erf, not erfc) that every model of the zoo uses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from zoo.layers.activations import gelu
from zoo.models.common import activation

X = np.concatenate([np.linspace(-12, 12, 2001), [-50.0, -8.5, 0.0, 1e-8, 30.0]]).astype(
    np.float32)


def test_values_and_gradients_equal_pytorch_and_jax():
    x = torch.from_numpy(X).requires_grad_()
    want = torch.nn.functional.gelu(x)
    want.sum().backward()
    got, grad = gelu(jnp.asarray(X)), jax.grad(lambda v: gelu(v).sum())(jnp.asarray(X))
    # tolerance: an element-wise function, no reduction: a few ulps of each value
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-6, atol=1e-6)
    # tolerance: as above; the erf formulation's derivative is ~1e-5 off where GELU' nears 0
    np.testing.assert_allclose(grad, x.grad.numpy(), rtol=1e-5, atol=1e-6)
    jax_exact = jax.nn.gelu(jnp.asarray(X), approximate=False)
    np.testing.assert_allclose(got, jax_exact, rtol=1e-6, atol=1e-6)  # tolerance: as above
    assert float(gelu(jnp.float32(-50.0))) == 0.0 == float(torch.nn.functional.gelu(
        torch.tensor(-50.0)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_keeps_the_dtype(dtype):
    assert gelu(jnp.ones(3, dtype)).dtype == dtype


def test_the_formulation_has_no_exponential_and_the_models_use_it():
    """The reason for the function: XLA lowers `erfc` (jax.nn.gelu's exact form) with an
    exponential and divisions, `erf` without; the MLP's "gelu" is this one."""
    def hlo(f):
        return jax.jit(f).lower(jnp.ones((4, 8))).compile().as_text()

    assert " exponential(" in hlo(lambda x: jax.nn.gelu(x, approximate=False))
    assert " exponential(" not in hlo(gelu)
    assert activation("gelu") is gelu


# The hard activations sit where PyTorch's kink: on a grid, at the kinks +-3 and on either side
# of them (just below 3, x + 3 rounds to 6 in float32, where jax.nn's take the outer slope).
KINKS = np.concatenate([np.linspace(-8, 8, 4001), [-3.0, 3.0, 0.0]]).astype(np.float32)
KINKS = np.concatenate([KINKS, np.nextafter(KINKS[-3:-1], 0), np.nextafter(KINKS[-3:-1], 9)])


@pytest.mark.parametrize(("name", "reference"), [
    ("hard_swish", torch.nn.functional.hardswish),
    ("hard_sigmoid", torch.nn.functional.hardsigmoid),
    ("silu", torch.nn.functional.silu), ("relu6", torch.nn.functional.relu6),
    ("sigmoid", torch.sigmoid)])
def test_activations_by_name_are_pytorchs_values_and_gradients(name, reference):
    """MobileNetV3's and EfficientNet's activations, by their config names: PyTorch's values
    and gradients, the hard ones' at their kinks too."""
    x = torch.from_numpy(KINKS).requires_grad_()
    want = reference(x)
    want.sum().backward()
    f = activation(name)
    got = jax.jit(f)(jnp.asarray(KINKS))
    grad = jax.jit(jax.grad(lambda v: f(v).sum()))(jnp.asarray(KINKS))
    # tolerance: element-wise functions, no reduction: within a few ulps of each value
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grad, x.grad.numpy(), rtol=1e-6, atol=1e-6)  # tolerance: as above
    assert f(jnp.ones(3, jnp.bfloat16)).dtype == jnp.bfloat16


def test_jax_nn_hard_activations_differ_from_pytorch_at_their_kinks():
    """Why the zoo has its own: just below 3, where x + 3 rounds to 6 in float32, jax.nn's
    gradients take the outer slope, PyTorch's the inner one."""
    below = np.nextafter(np.float32(3), np.float32(0))
    assert float(jax.grad(jax.nn.hard_sigmoid)(below)) == 0.0
    assert float(jax.grad(activation("hard_sigmoid"))(below)) == pytest.approx(1 / 6)
    assert float(jax.grad(jax.nn.hard_swish)(below)) == 1.0
    assert float(jax.grad(activation("hard_swish"))(below)) == pytest.approx(1.5)
