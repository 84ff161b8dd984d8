"""The training step, written once: losses, and the pure step every caller jits its own way.

`zoo.runtime.fast.train_step` wraps `pure_step` with pre-flattened leaves and donation; the
benchmark's call styles jit it over pytrees; tests and examples use `zoo.runtime.fast.train_step`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from zoo.configs import Config
from zoo.interface import Interface
from zoo.layers.moe import load_balancing_loss

Loss = Callable[[jax.Array, Any], jax.Array]


def cross_entropy(y: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of logits `y` (N, classes) and integer `labels` (N,)."""
    return optax.softmax_cross_entropy_with_integer_labels(y.astype(jnp.float32), labels).mean()


def mse(y: jax.Array, target: jax.Array) -> jax.Array:
    """Mean squared error in float32 (any layout, as long as `target` has `y`'s)."""
    return jnp.mean(jnp.square(y.astype(jnp.float32) - target.astype(jnp.float32)))


IGNORE = -100  # a label the next-token loss skips (transformers' and PyTorch's ignore_index)


def next_token(y: jax.Array, labels: jax.Array) -> jax.Array:
    """A language model's loss: the mean softmax cross-entropy of the logits `y` `(N, L, V)` at
    positions `0 .. L-2` against the labels one step ahead, `labels[:, 1:]` (`labels` `(N, L)`:
    the token ids themselves, with `IGNORE` (-100) where a token is padding or not to be
    learnt), over the labels not ignored; `transformers`' `ForCausalLMLoss` (its `loss` for
    `labels=`)."""
    logits = y[:, :-1].astype(jnp.float32)
    target = labels[:, 1:]
    keep = target != IGNORE
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(keep, target, 0))
    return jnp.sum(jnp.where(keep, losses, 0.0)) / jnp.maximum(jnp.sum(keep), 1)


def masked_token(y: jax.Array, labels: jax.Array) -> jax.Array:
    """A masked language model's loss: the mean softmax cross-entropy of the logits `y`
    `(N, L, V)` at every position against `labels` `(N, L)` there, over the labels not
    `IGNORE`d (transformers' `...ForMaskedLM` loss for `labels=`: the masked tokens' ids,
    -100 elsewhere)."""
    keep = labels != IGNORE
    losses = optax.softmax_cross_entropy_with_integer_labels(y.astype(jnp.float32),
                                                            jnp.where(keep, labels, 0))
    return jnp.sum(jnp.where(keep, losses, 0.0)) / jnp.maximum(jnp.sum(keep), 1)


def token_labels(input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
    """The next-token loss's labels for a batch of token ids: the ids, `IGNORE` where
    `attention_mask` is 0 (padding)."""
    if attention_mask is None:
        return input_ids
    return jnp.where(attention_mask.astype(bool), input_ids, IGNORE)


def router_loss(loss_fn: Loss, coef: float, top_k: int) -> Loss:
    """The training loss of a mixture of experts whose output is `(logits, router_logits)`
    (a decoder spec's `output_router_logits`): `loss_fn(logits, labels)` plus `coef` times
    the load-balancing loss (`zoo.layers.moe.load_balancing_loss`) over the tokens the labels
    keep (`IGNORE`: padding), as transformers' `labels=` loss with `output_router_logits`
    (`router_aux_loss_coef * aux_loss`)."""

    def loss(y: tuple[jax.Array, jax.Array], labels: jax.Array) -> jax.Array:
        logits, router = y
        aux = load_balancing_loss(router, top_k, labels != IGNORE)
        return loss_fn(logits, labels) + coef * aux

    return loss


LOSSES: dict[str, Loss] = {"cross_entropy": cross_entropy, "mse": mse, "next_token": next_token,
                           "masked_token": masked_token}
TOKEN_LOSSES = ("next_token", "masked_token")  # labels are token ids (the input's)


def targets(config: Config, batch: int, key: jax.Array, dtype: Any = "float32",
            x: jax.Array | None = None) -> jax.Array:
    """Targets of the architecture's task, canonical layout: random labels for cross_entropy,
    random normal arrays shaped like the output for mse; for the token losses the token labels of
    the input `x` (the task of a language model), or random token ids without one."""
    if config.LOSS == "cross_entropy":
        return jax.random.randint(key, (batch,), 0, config.output_shape[0])
    if config.LOSS in TOKEN_LOSSES:
        return x if x is not None else config.sample_input(key, batch)
    return jax.random.normal(key, (batch, *config.output_shape), jnp.float32).astype(dtype)


def pure_step(api: Interface, static: Any, optimizer: optax.GradientTransformation,
              loss_fn: Loss) -> Callable[..., tuple[Any, Any, Any, jax.Array]]:
    """`step(params, opt_state, state, x, target, key=None, **inputs) -> (params, opt_state,
    state, loss)`: loss and gradients of the training-mode forward, one optimizer update, the
    new BatchNorm statistics. With `frozen` (the other part of `api.partition`), `params` is
    the trainable part: only it is differentiated and updated. `inputs`: the model's other
    inputs (a language model's `attention_mask`, `position_ids`), passed to `api.apply`.
    Pure: jit it (the static part is closed over)."""

    def step(params: Any, opt_state: Any, state: Any, x: jax.Array, target: Any,
             key: jax.Array | None = None, *, frozen: Any = None,
             **inputs: Any) -> tuple[Any, Any, Any, jax.Array]:
        def objective(params: Any) -> tuple[jax.Array, Any]:
            whole = params if frozen is None else api.combine(params, frozen)
            y, new_state = api.apply(static, whole, state, x, train=True, key=key, **inputs)
            return loss_fn(y, target), new_state

        (loss, new_state), grads = jax.value_and_grad(objective, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, new_state, loss

    return step
