"""A fourth architecture registered only here: a config and four tiny classes.

Registered by `tests/conftest.py` before the registry-wide tests are collected, it gets every
check they run (equivalence, conversion, checkpoints, the PyTorch reference, the benchmark's
tiny preset) without any edit to the zoo, the converters or the tests. It has a linear layer, a
LayerNorm and a bare parameter (`offset`), so the mechanisms beyond the built-in architectures'
layer kinds are covered too.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, ClassVar

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

import zoo
from zoo.bench.spec import BenchSpec
from zoo.bench.spec import register as register_bench
from zoo.configs import Config

EPS = 1e-5  # PyTorch's and Equinox's LayerNorm default; Flax's is 1e-6


@dataclass(frozen=True)
class ToyConfig(Config):
    """proj (linear) -> LayerNorm -> gelu, plus a learned offset: in -> width."""

    arch: ClassVar[str] = "toy"
    TINY: ClassVar[dict[str, Any]] = {"in_features": 6, "width": 5}
    LOSS: ClassVar[str] = "mse"
    in_features: int = 8
    width: int = 8

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_features,)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.width,)


class EqxToy(eqx.Module):
    proj: eqx.nn.Linear
    norm: eqx.nn.LayerNorm
    offset: jax.Array
    config: ToyConfig = eqx.field(static=True)

    def __init__(self, config: ToyConfig, *, key: jax.Array, dtype: Any = None) -> None:
        self.proj = eqx.nn.Linear(config.in_features, config.width, key=key, dtype=dtype)
        self.norm = eqx.nn.LayerNorm(config.width, eps=EPS, dtype=dtype)
        self.offset = jnp.zeros(config.width, dtype)
        self.config = config

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        self.config.check_input(x.shape, batched=False)
        return jax.nn.gelu(self.norm(self.proj(x)), approximate=False) + self.offset


class LinenToy(nn.Module):
    config: ToyConfig
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        self.config.check_input(x.shape, channels_last=True)
        width, dt = self.config.width, jnp.dtype(self.param_dtype)
        x = nn.Dense(width, param_dtype=dt, name="proj")(x)
        x = nn.LayerNorm(EPS, use_fast_variance=False, param_dtype=dt, name="norm")(x)
        offset = self.param("offset", nn.initializers.zeros, (width,), dt)
        return nn.gelu(x, approximate=False) + offset[None]


class NNXToy(nnx.Module):
    def __init__(self, config: ToyConfig, *, rngs: nnx.Rngs, param_dtype: Any = None) -> None:
        dt = jnp.dtype(param_dtype or "float32")
        self.config = config
        self.proj = nnx.Linear(config.in_features, config.width, param_dtype=dt, rngs=rngs)
        self.norm = nnx.LayerNorm(config.width, epsilon=EPS, use_fast_variance=False,
                                  param_dtype=dt, rngs=rngs)
        self.offset = nnx.Param(jnp.zeros(config.width, dt))

    def __call__(self, x: jax.Array, *, rngs: Any = None) -> jax.Array:
        self.config.check_input(x.shape, channels_last=True)
        return nnx.gelu(self.norm(self.proj(x)), approximate=False) + self.offset[None]


classes: dict[str, Any] = {"eqx": EqxToy, "linen": LinenToy, "nnx": NNXToy}
if importlib.util.find_spec("torch") is not None:
    import torch

    class TorchToy(torch.nn.Module):
        def __init__(self, config: ToyConfig) -> None:
            super().__init__()
            self.config = config
            self.proj = torch.nn.Linear(config.in_features, config.width)
            self.norm = torch.nn.LayerNorm(config.width, eps=EPS)
            self.offset = torch.nn.Parameter(torch.zeros(config.width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.config.check_input(x.shape)
            return torch.nn.functional.gelu(self.norm(self.proj(x))) + self.offset

    classes["torch"] = TorchToy

zoo.register(ToyConfig, **classes)


def _useful_flops(config: ToyConfig, batch: int, mode: str) -> float:
    """The projection's multiply-adds x 2 (its weight gradient doubles them in training): the
    floor the benchmark's FLOP check holds every library to. The rest is elementwise, whose
    pre-optimisation count differs by layout (per-sample Equinox against batched Flax)."""
    forward = 2.0 * batch * config.in_features * config.width
    return forward if mode == "forward" else 2 * forward


register_bench(BenchSpec("toy", default_batch=4, useful_flops=_useful_flops))
