"""Small pieces shared by the JAX implementations."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from zoo.layers.activations import gelu, gelu_tanh, quick_gelu, silu

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": gelu,  # exact erf form, as torch.nn.GELU()
    "gelu_tanh": gelu_tanh,  # torch.nn.GELU(approximate="tanh")
    "quick_gelu": quick_gelu,  # x * sigmoid(1.702 x), OpenAI CLIP
    "silu": silu,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    return ACTIVATIONS[name]


def dtype_of(dtype: str | jnp.dtype | None) -> jnp.dtype:
    return jnp.dtype("float32" if dtype is None else dtype)
