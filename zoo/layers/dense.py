"""A dense layer's product with its weight held `(out, in)` (PyTorch's and Equinox's layout;
a tied head's embedding `(vocab, features)` too), in every JAX library.

`x @ weight.T` (and Flax's `Embed.attend`, `jnp.dot(query, embedding.T)`) makes XLA:CPU
materialise the transposed weight at every call: in a decode step, a copy of every such
weight per token. `contract` gives the same values with one `dot_general` that reads the
weight where it lies (pinned by tests/test_generation.py on a compiled decode step).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

__all__ = ["contract"]


def contract(x: Array, weight: Array) -> Array:
    """`x @ weight.T`, `(..., out)`: `x`'s last axis contracted with the weight's axis 1, no
    transpose of the weight."""
    return jnp.einsum("...i,oi->...o", x, weight)
