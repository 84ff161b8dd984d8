"""An Equinox BatchNorm with Flax/PyTorch semantics.

`eqx.nn.BatchNorm` has two modes and neither equals Flax or PyTorch (see docs/conventions.md):
"ema" normalises training outputs with the freshly updated running statistics, "batch"
zero-debiases the stored statistics at inference. This layer does what Flax does:

- training: normalise with the biased batch statistics, then update
  ``running = momentum * running + (1 - momentum) * batch`` (biased variance stored);
- inference (``inference=True``, e.g. via ``eqx.nn.inference_mode``): normalise with the running
  statistics as stored.

Like every Equinox BatchNorm it is called per sample inside ``jax.vmap(..., axis_name=...)`` and
keeps its running statistics in an ``eqx.nn.State``.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

import canonical


class BatchNorm(eqx.Module):
    """Batch normalisation over all axes but the first (channels) of one sample.

    **Arguments:**
    - `num_features`: number of channels.
    - `axis_name`: the `vmap` axis name carrying the batch.
    - `momentum`: weight of the old running value (Flax convention; PyTorch's is `1 - momentum`).
    - `eps`: added to the variance inside the square root.
    - `inference`: use the running statistics instead of the batch's.
    - `dtype`: parameter and running-statistics dtype.
    """

    weight: Array
    bias: Array
    state_index: eqx.nn.StateIndex[tuple[Array, Array]]
    axis_name: str = eqx.field(static=True)
    momentum: float = eqx.field(static=True)
    eps: float = eqx.field(static=True)
    inference: bool

    def __init__(
        self,
        num_features: int,
        axis_name: str = "batch",
        momentum: float = 0.99,
        eps: float = 1e-5,
        inference: bool = False,
        dtype: jnp.dtype | None = None,
    ) -> None:
        dtype = jnp.float32 if dtype is None else dtype
        self.weight = jnp.ones((num_features,), dtype)
        self.bias = jnp.zeros((num_features,), dtype)
        self.state_index = eqx.nn.StateIndex(
            (jnp.zeros((num_features,), dtype), jnp.ones((num_features,), dtype))
        )
        self.axis_name = axis_name
        self.momentum = momentum
        self.eps = eps
        self.inference = inference

    def __call__(
        self, x: Array, state: eqx.nn.State, *, key: Array | None = None
    ) -> tuple[Array, eqx.nn.State]:
        """Normalise one sample `x` of shape `(C, *spatial)`; returns `(y, state)`."""
        del key
        if x.shape[0] != self.weight.shape[0]:
            raise ValueError(
                f"BatchNorm expects {self.weight.shape[0]} channels on axis 0, got shape {x.shape}"
            )
        # Computed channels-last, `(*spatial, C)`: under `vmap` XLA then sees `(N, *spatial, C)`,
        # the layout of its convolutions, and the transposes around conv -> BN -> conv cancel.
        # Channels-first, XLA:CPU re-reads a convolution's output transposed in each fusion of
        # the BN (forward and backward; docs/investigations/cpu_training_step.md, "Equinox's
        # layout transposes").
        xl = jnp.moveaxis(x, 0, -1)
        spatial = tuple(range(x.ndim - 1))
        shape = (*(1,) * len(spatial), -1)
        if self.inference:
            mean, var = state.get(self.state_index)
        else:
            # Statistics in float32 (as Flax does), two-pass variance (no E[x^2] - E[x]^2).
            x32 = xl.astype(jnp.promote_types(x.dtype, jnp.float32))
            mean = jax.lax.pmean(jnp.mean(x32, spatial), self.axis_name)
            centred = x32 - mean.reshape(shape)
            var = jax.lax.pmean(jnp.mean(jnp.square(centred), spatial), self.axis_name)
            old_mean, old_var = state.get(self.state_index)
            m = self.momentum
            state = state.set(
                self.state_index,
                (
                    (m * old_mean + (1 - m) * mean).astype(old_mean.dtype),
                    (m * old_var + (1 - m) * var).astype(old_var.dtype),
                ),
            )
        # Normalise as Flax does: in the promoted dtype of the input and the statistics (float32
        # batch statistics in training; the stored ones, e.g. bfloat16, at inference).
        mul = jax.lax.rsqrt(var + self.eps) * self.weight
        y = (xl - mean.reshape(shape)) * mul.reshape(shape) + self.bias.reshape(shape)
        y = y.astype(jnp.result_type(x.dtype, self.weight.dtype, self.bias.dtype))
        return jnp.moveaxis(y, -1, 0), state


canonical.register_class("batch_norm", "eqx", BatchNorm)
