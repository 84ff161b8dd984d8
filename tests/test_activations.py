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
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grad, x.grad.numpy(), rtol=1e-5, atol=1e-6)
    jax_exact = jax.nn.gelu(jnp.asarray(X), approximate=False)
    np.testing.assert_allclose(got, jax_exact, rtol=1e-6, atol=1e-6)
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
