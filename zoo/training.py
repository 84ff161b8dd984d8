"""The training step, written once: losses, and the pure step every caller jits its own way.

`zoo.fast.train_step` wraps `pure_step` with pre-flattened leaves and donation; the benchmark's
call styles jit it over pytrees; tests and examples use `zoo.fast.train_step`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from zoo.configs import Config
from zoo.interface import Interface

Loss = Callable[[jax.Array, Any], jax.Array]


def cross_entropy(y: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of logits `y` (N, classes) and integer `labels` (N,)."""
    return optax.softmax_cross_entropy_with_integer_labels(y.astype(jnp.float32), labels).mean()


def mse(y: jax.Array, target: jax.Array) -> jax.Array:
    """Mean squared error in float32 (any layout, as long as `target` has `y`'s)."""
    return jnp.mean(jnp.square(y.astype(jnp.float32) - target.astype(jnp.float32)))


LOSSES: dict[str, Loss] = {"cross_entropy": cross_entropy, "mse": mse}


def targets(config: Config, batch: int, key: jax.Array, dtype: Any = "float32") -> jax.Array:
    """Random targets of the architecture's task, canonical layout: labels for cross_entropy,
    normal arrays shaped like the output for mse."""
    if config.LOSS == "cross_entropy":
        return jax.random.randint(key, (batch,), 0, config.output_shape[0])
    return jax.random.normal(key, (batch, *config.output_shape), jnp.float32).astype(dtype)


def pure_step(api: Interface, static: Any, optimizer: optax.GradientTransformation,
              loss_fn: Loss) -> Callable[..., tuple[Any, Any, Any, jax.Array]]:
    """`step(params, opt_state, state, x, target, key=None) -> (params, opt_state, state,
    loss)`: loss and gradients of the training-mode forward, one optimizer update, the new
    BatchNorm statistics. Pure: jit it (the static part is closed over)."""

    def step(params: Any, opt_state: Any, state: Any, x: jax.Array, target: Any,
             key: jax.Array | None = None) -> tuple[Any, Any, Any, jax.Array]:
        def objective(params: Any) -> tuple[jax.Array, Any]:
            y, new_state = api.apply(static, params, state, x, train=True, key=key)
            return loss_fn(y, target), new_state

        (loss, new_state), grads = jax.value_and_grad(objective, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, new_state, loss

    return step
