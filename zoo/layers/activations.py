"""Activations whose formulation the zoo chooses for speed, with the function unchanged."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import Array

__all__ = ["gelu", "gelu_tanh", "quick_gelu", "silu"]

_SQRT_HALF = 1 / math.sqrt(2)


def gelu(x: Array) -> Array:
    """The exact GELU, `x * Phi(x)`, as PyTorch computes it: `0.5 * x * (1 + erf(x / sqrt 2))`.

    `jax.nn.gelu(approximate=False)` computes the same function as `x * erfc(-x / sqrt 2) / 2`.
    XLA lowers `erfc` to two rational approximations, an exponential and divisions, and
    recomputes it in the backward pass; `erf` is one polynomial. The ViT training step ran 0.95x
    the time (docs/benchmarks.md). The two differ by float rounding (at most 2.4e-7 on the ViT's
    activations), and where `x` is very negative this form gives PyTorch's exact 0.
    """
    return 0.5 * x * (1 + jax.lax.erf(x * jnp.asarray(_SQRT_HALF, x.dtype)))


def gelu_tanh(x: Array) -> Array:
    """GELU's tanh approximation, PyTorch's `gelu(approximate="tanh")` (timm's "gelu_tanh",
    transformers' "gelu_pytorch_tanh": the SigLIP towers of big_vision and Hugging Face)."""
    return jax.nn.gelu(x, approximate=True)


def quick_gelu(x: Array) -> Array:
    """`x * sigmoid(1.702 x)`, OpenAI CLIP's QuickGELU (timm's "quick_gelu")."""
    return x * jax.nn.sigmoid(jnp.asarray(1.702, x.dtype) * x)


def silu(x: Array) -> Array:
    """`x * sigmoid(x)` (SiLU, Swish), the gate of timm's SwiGLU MLPs."""
    return jax.nn.silu(x)
