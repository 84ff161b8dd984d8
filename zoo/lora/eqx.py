"""LoRA in Equinox: each targeted `Linear` leaf replaced (`eqx.tree_at`) by a module holding it
as `base_layer` beside the factors `lora_A` `(rank, in)` and `lora_B` `(out, rank)` (peft's
names and layout), per sample as every Equinox layer."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import Array

from canonical.walkers import get
from zoo.layers.eqx import Linear
from zoo.lora import common


class LoRALinear(eqx.Module):
    """`base_layer(x) + scale * lora_B(lora_A(x))` on one input `(in,)`."""

    base_layer: eqx.nn.Linear
    lora_A: Linear
    lora_B: Linear
    spec: Any = eqx.field(static=True)  # zoo.lora.LoraSpec

    def __call__(self, x: Array, *, key: Any = None) -> Array:
        return self.base_layer(x) + self.spec.scale * self.lora_B(self.lora_A(x))


def _factor(weight: Any, like: Array) -> Linear:
    n_out, n_in = weight.shape
    layer = Linear(n_in, n_out, use_bias=False, key=jax.random.key(0), dtype=like.dtype)
    return eqx.tree_at(lambda m: m.weight, layer, jnp.asarray(weight, like.dtype))


def _is_lora(x: Any) -> bool:
    return isinstance(x, LoRALinear)


def _split(model: Any) -> tuple[Any, Any]:
    return model if isinstance(model, tuple) else (model, None)


def _join(module: Any, state: Any) -> Any:
    return module if state is None else (module, state)


def wrap(model: Any, targets: list, factors: dict, spec: Any) -> Any:
    module, state = _split(model)
    layers = [get(module, t.path) for t in targets]
    new = [LoRALinear(old, _factor(factors[t.name][0], old.weight),
                      _factor(factors[t.name][1], old.weight), spec)
           for t, old in zip(targets, layers, strict=True)]
    where = lambda m: [get(m, t.path) for t in targets]
    return _join(eqx.tree_at(where, module, new), state)


def unwrap(model: Any) -> Any:
    module, state = _split(model)
    where = lambda m: [x for x in jax.tree.leaves(m, is_leaf=_is_lora) if _is_lora(x)]
    old = where(module)
    return _join(eqx.tree_at(where, module, [x.base_layer for x in old]) if old else module,
                 state)


def factors(model: Any) -> dict:
    return common.factors(model, "eqx")


def spec(model: Any) -> Any:
    found = [x for x in jax.tree.leaves(_split(model)[0], is_leaf=_is_lora) if _is_lora(x)]
    return found[0].spec if found else None
