"""Small pieces shared by the JAX implementations."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from zoo.layers.activations import gelu, gelu_tanh

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": gelu,  # exact erf form, as torch.nn.GELU()
    "gelu_new": gelu_tanh,  # transformers' names of the tanh form (GPT-2)
    "gelu_pytorch_tanh": gelu_tanh,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    return ACTIVATIONS[name]


def dtype_of(dtype: str | jnp.dtype | None) -> jnp.dtype:
    return jnp.dtype("float32" if dtype is None else dtype)
