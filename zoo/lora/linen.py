"""LoRA in Linen: the factors live beside each targeted Dense's kernel in the `params`
collection (`lora_A: {kernel (in, rank)}`, `lora_B: {kernel (rank, out)}`), and the model
becomes a subclass of its own class (same fields, same scopes, plus the `lora` spec) whose
call intercepts every Dense call (`nn.intercept_methods`) of a layer holding factors and adds
`scale * x @ A @ B`. The module tree and parameter paths stay the model's."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from flax.core import unfreeze

from canonical.walkers import get
from zoo.lora import common


def _intercept(spec: Any, next_fun: Any, args: tuple, kwargs: dict, context: Any) -> Any:
    y = next_fun(*args, **kwargs)
    if context.method_name != "__call__":
        return y
    params = context.module.variables.get("params", {})
    if "lora_A" not in params:
        return y
    x = args[0]
    a, b = params["lora_A"]["kernel"], params["lora_B"]["kernel"]
    return y + spec.scale * ((x @ a) @ b)


@functools.cache
def adapted_class(cls: type) -> type:
    """`cls` with a `lora` field, its call run under the LoRA interceptor."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        with nn.intercept_methods(functools.partial(_intercept, self.lora)):
            return cls.__call__(self, *args, **kwargs)

    namespace = {"__call__": __call__, "__annotations__": {"lora": Any},
                 "lora": None, "__module__": cls.__module__,
                 "__doc__": f"{cls.__name__} with LoRA factors (zoo.lora)."}
    return type(f"LoRA{cls.__name__}", (cls,), namespace)


def _fields(module: nn.Module) -> dict[str, Any]:
    return {f.name: getattr(module, f.name) for f in dataclasses.fields(module)
            if f.init and f.name not in ("parent", "name", "lora")}


def wrap(model: Any, targets: list, factors: dict, spec: Any) -> Any:
    module, variables = model
    variables = unfreeze(variables)  # new dicts: the caller's stay as they were
    variables = {k: (dict(v) if k != "params" else _copy(v)) for k, v in variables.items()}
    for t in targets:
        layer = get(variables["params"], t.path)
        dtype = layer["kernel"].dtype
        a, b = (jnp.asarray(f, dtype).T for f in factors[t.name])
        layer["lora_A"], layer["lora_B"] = {"kernel": a}, {"kernel": b}
    base = type(module).__mro__[1] if spec_of(module) is not None else type(module)
    return adapted_class(base)(**_fields(module), lora=spec), variables


def _copy(tree: Any) -> Any:
    return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def _strip(tree: Any) -> Any:
    if not isinstance(tree, dict):
        return tree
    return {k: _strip(v) for k, v in tree.items() if k not in ("lora_A", "lora_B")}


def spec_of(module: nn.Module) -> Any:
    return getattr(module, "lora", None)


def unwrap(model: Any) -> Any:
    module, variables = model
    if spec_of(module) is None:
        return model
    plain = type(module).__mro__[1](**_fields(module))
    return plain, {k: (_strip(unfreeze(v)) if k == "params" else v)
                   for k, v in variables.items()}


def factors(model: Any) -> dict:
    return common.factors(model, "linen")


def spec(model: Any) -> Any:
    return spec_of(model[0])
