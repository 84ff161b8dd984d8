"""Small pieces shared by the JAX implementations."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from zoo.layers.activations import gelu, gelu_tanh, hard_sigmoid, hard_swish, quick_gelu, silu

# PyTorch's functions, by the names the configs use (tests/test_activations.py).
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": gelu,  # exact erf form, as torch.nn.GELU()
    "gelu_new": gelu_tanh,  # transformers' names of the tanh form (GPT-2)
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu_tanh": gelu_tanh,  # torch.nn.GELU(approximate="tanh")
    "quick_gelu": quick_gelu,  # x * sigmoid(1.702 x), OpenAI CLIP
    "relu6": jax.nn.relu6,
    "silu": silu,
    "sigmoid": jax.nn.sigmoid,
    "hard_swish": hard_swish,  # x * relu6(x + 3) / 6, F.hardswish's gradient
    "hard_sigmoid": hard_sigmoid,  # relu6(x + 3) / 6, F.hardsigmoid's gradient
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    return ACTIVATIONS[name]


def dtype_of(dtype: str | jnp.dtype | None) -> jnp.dtype:
    return jnp.dtype("float32" if dtype is None else dtype)
