"""Equinox layers of the zoo: a Flax-semantics BatchNorm and a conv-transpose with methods."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.batch_norm import BatchNorm
from zoo.layers.conv_transpose import CHOICES, conv_transpose

__all__ = ["BatchNorm", "ConvTranspose"]


class ConvTranspose(eqx.nn.ConvTranspose):
    """`eqx.nn.ConvTranspose` with a choice of exactly-equal formulations (`method`).

    Same fields, parameter layout and PyTorch-style arguments as `eqx.nn.ConvTranspose`, so
    checkpoints and converters treat both alike. `method` is one of `zoo.layers.METHODS` or
    "auto" (see `zoo.layers.conv_transpose.choose_method`). Zero padding and groups=1 only.
    """

    method: str = eqx.field(static=True)

    def __init__(self, *args, method: str = "auto", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if method not in CHOICES:
            raise ValueError(f"unknown conv-transpose method {method!r}; use one of "
                             f"{CHOICES}")
        if self.groups != 1 or self.padding_mode != "ZEROS" or isinstance(self.padding, str):
            raise ValueError("zoo ConvTranspose supports groups=1, zero, explicit padding only")
        if any(lo != hi for lo, hi in self.padding):
            raise ValueError(f"zoo ConvTranspose needs symmetric padding, got {self.padding}")
        self.method = method

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply to one sample `x` of shape `(in_channels, *spatial)`."""
        del key
        n = self.num_spatial_dims
        if x.ndim != n + 1:
            raise ValueError(f"ConvTranspose expects rank {n + 1} input, got shape {x.shape}")
        sp = "DHW"[-n:] if n <= 3 else "".join(chr(ord("a") + i) for i in range(n))
        y = conv_transpose(
            x[None], self.weight, stride=self.stride,
            padding=tuple(lo for lo, _ in self.padding), output_padding=self.output_padding,
            dilation=self.dilation, dimension_numbers=("NC" + sp, "OI" + sp, "NC" + sp),
            method=self.method,
        )[0]
        if self.use_bias:
            y = y + jnp.asarray(self.bias)
        return y


def with_new_head(model: Any, name: str, in_features: int, num_classes: int, *,
                  key: jax.Array) -> Any:
    """A copy of `model` whose Linear `name` is a fresh one for `num_classes` and whose config
    says so (timm's `reset_classifier`, functionally); `model` is not changed. The config is a
    static field, which `eqx.tree_at` cannot replace."""
    head = getattr(model, name)
    new = copy.copy(model)
    object.__setattr__(new, "config", dataclasses.replace(model.config, num_classes=num_classes))
    object.__setattr__(new, name, eqx.nn.Linear(in_features, num_classes, key=key,
                                                dtype=head.weight.dtype))
    return new
