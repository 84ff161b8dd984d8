"""Activations whose formulation the zoo chooses (for speed, or for PyTorch's gradients at the
kinks), with the function unchanged."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import Array

__all__ = ["gelu", "gelu_tanh", "hard_sigmoid", "hard_swish", "quick_gelu", "silu"]

_SQRT_HALF = 1 / math.sqrt(2)


def gelu(x: Array) -> Array:
    """The exact GELU, `x * Phi(x)`, as PyTorch computes it: `0.5 * x * (1 + erf(x / sqrt 2))`.

    `jax.nn.gelu(approximate=False)` computes the same function as `x * erfc(-x / sqrt 2) / 2`.
    XLA lowers `erfc` to two rational approximations, an exponential and divisions, and
    recomputes it in the backward pass; `erf` is one polynomial. The ViT training step ran 0.95x
    the time (docs/investigations/cpu_training_step.md). The two differ by float rounding (at
    most 2.4e-7 on the ViT's
    activations), and where `x` is very negative this form gives PyTorch's exact 0.
    """
    return 0.5 * x * (1 + jax.lax.erf(x * jnp.asarray(_SQRT_HALF, x.dtype)))


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def gelu_tanh(x: Array) -> Array:
    """GELU's tanh approximation as transformers' `gelu_new` (GPT-2) writes it:
    `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`; PyTorch's
    `gelu(approximate="tanh")` (timm's "gelu_tanh", transformers' "gelu_pytorch_tanh": the SigLIP
    towers of big_vision and Hugging Face)."""
    inner = jnp.asarray(_SQRT_2_OVER_PI, x.dtype) * (x + jnp.asarray(0.044715, x.dtype) * x ** 3)
    return 0.5 * x * (1 + jnp.tanh(inner))


# PyTorch's hard activations with PyTorch's gradients, kinks included: the inner slope on the
# open interval (-3, 3), also just below 3 where x + 3 rounds to 6 in float32 (there
# `jax.nn.hard_swish` / `hard_sigmoid` take the outer one; tests/test_activations.py).
@jax.custom_jvp
def hard_sigmoid(x: Array) -> Array:
    """`relu6(x + 3) / 6`, PyTorch's `F.hardsigmoid` (MobileNetV3's squeeze-and-excite gate)."""
    return jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6


@hard_sigmoid.defjvp
def _hard_sigmoid_jvp(primals: tuple[Array], tangents: tuple[Array]) -> tuple[Array, Array]:
    (x,), (t,) = primals, tangents
    return hard_sigmoid(x), t * jnp.where((x > -3) & (x < 3), 1 / 6, 0).astype(t.dtype)


@jax.custom_jvp
def hard_swish(x: Array) -> Array:
    """`x * relu6(x + 3) / 6`, PyTorch's `F.hardswish` (MobileNetV3's activation)."""
    return x * jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6


@hard_swish.defjvp
def _hard_swish_jvp(primals: tuple[Array], tangents: tuple[Array]) -> tuple[Array, Array]:
    (x,), (t,) = primals, tangents
    slope = jnp.where(x <= -3, 0, jnp.where(x < 3, x / 3 + 0.5, 1)).astype(t.dtype)
    return hard_swish(x), t * slope


def quick_gelu(x: Array) -> Array:
    """`x * sigmoid(1.702 x)`, OpenAI CLIP's QuickGELU (timm's "quick_gelu")."""
    return x * jax.nn.sigmoid(jnp.asarray(1.702, x.dtype) * x)


def silu(x: Array) -> Array:
    """`x * sigmoid(x)` (SiLU, Swish), the gate of timm's SwiGLU MLPs."""
    return jax.nn.silu(x)
