"""LoRA in NNX: each targeted `nnx.Linear` replaced, on a copy, by a module holding it as
`base_layer` beside the factors `lora_A` and `lora_B`, whose kernels (`(in, rank)`,
`(rank, out)`, Flax's layout) are `nnx.LoRAParam`s: `nnx.Optimizer(model, tx,
wrt=nnx.LoRAParam)` trains them alone, as `zoo.lora.TRAINABLE` does. (`nnx.LoRA` has no
`alpha` scale and names its factors `lora_a` / `lora_b`, not peft's names.)"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx
from jax import Array

from canonical.walkers import get
from zoo.lora import common


class LoRAFactor(nnx.Module):
    """A bias-free linear map whose `kernel` is an `nnx.LoRAParam`."""

    def __init__(self, kernel: Array) -> None:
        self.kernel = nnx.LoRAParam(kernel)

    def __call__(self, x: Array) -> Array:
        return x @ self.kernel[...]


class LoRALinear(nnx.Module):
    """`base_layer(x) + scale * lora_B(lora_A(x))`, batched."""

    def __init__(self, base_layer: nnx.Module, a: Array, b: Array, spec: Any) -> None:
        self.base_layer = base_layer
        self.lora_A = LoRAFactor(a)
        self.lora_B = LoRAFactor(b)
        self.spec = spec  # zoo.lora.LoraSpec, static

    def __call__(self, x: Array) -> Array:
        return self.base_layer(x) + self.spec.scale * self.lora_B(self.lora_A(x))


def wrap(model: Any, targets: list, factors: dict, spec: Any) -> Any:
    model = nnx.clone(model)
    for t in targets:
        parent, old = get(model, t.path[:-1]), get(model, t.path)
        dtype = old.kernel[...].dtype
        a, b = (jnp.asarray(f, dtype).T for f in factors[t.name])
        setattr(parent, t.path[-1], LoRALinear(old, a, b, spec))
    return model


def _adapted(model: Any) -> list[tuple[tuple, LoRALinear]]:
    return [(path, m) for path, m in nnx.iter_graph(model) if isinstance(m, LoRALinear)]


def unwrap(model: Any) -> Any:
    model = nnx.clone(model)
    for path, m in _adapted(model):
        setattr(get(model, path[:-1]), str(path[-1]), m.base_layer)
    return model


def factors(model: Any) -> dict:
    return common.factors(model, "nnx")


def spec(model: Any) -> Any:
    found = _adapted(model)
    return found[0][1].spec if found else None
