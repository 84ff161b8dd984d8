"""Flax Linen: batched, channels-last modules; `(module, variables)` pairs."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from canonical.walkers import LinenWalker, in_order, leaf_paths
from zoo.configs import Config
from zoo.interface import LinenInterface
from zoo.libraries.library import Library


class LinenModel(Protocol):
    """A Linen model class: an `nn.Module` with the fields `config` and `param_dtype` (a dtype
    name), called as `module.apply(variables, x, train=...)`, dropout from the "dropout" RNG
    stream; randomness comes at `module.init({"params": key, "dropout": key}, x)`."""

    config: Config
    param_dtype: str


class LinenLibrary(Library):
    name = "linen"
    channels_last = True
    pads_same = True  # nn.Conv's default padding is "SAME"
    package = "flax"
    checkpoint_format = "linen"
    abstract_skeleton = True
    walker = LinenWalker()
    interface = LinenInterface()
    lora = "zoo.lora.linen"
    contract = LinenModel
    dtype_argument = "param_dtype"

    def owns(self, obj: Any) -> bool:
        nn = sys.modules.get("flax.linen")  # no Linen module exists before Flax is imported
        return (nn is not None and isinstance(obj, tuple) and len(obj) == 2
                and isinstance(obj[0], nn.Module))

    def native_init(self, cls: type, config: Config, key: jax.Array, dtype: Any) -> Any:
        dt = jnp.dtype(dtype)
        module = cls(config, param_dtype=dt.name)
        x = jnp.zeros(self.input_shape(config, 1), self.input_dtype(config, dt))
        return module, module.init({"params": key, "dropout": key}, x)

    def skeleton(self, cls: type, config: Config, dtype: Any) -> Any:
        """Abstract variables in creation order, as `module.init` returns them (`eval_shape`
        alone gives the keys sorted, and the canonical order follows the variables' order)."""
        module = cls(config, param_dtype=jnp.dtype(dtype).name)
        rngs = {"params": jax.random.key(0), "dropout": jax.random.key(0)}
        order: list[tuple[str, ...]] = []

        def init(rngs: dict[str, jax.Array], x: jax.Array) -> Any:
            variables = module.init(rngs, x)
            order.extend(leaf_paths(variables))
            return variables

        abstract = jax.eval_shape(init, rngs, self.abstract_input(config))
        return module, in_order(abstract, order)

    def logical_box(self, array: Any, names: tuple[str | None, ...]) -> Any:
        """Linen's idiom: `nn.LogicallyPartitioned`, as `nn.with_logical_partitioning` makes
        it; `module.apply` unboxes it, `nn.get_partition_spec` reads the names."""
        import flax.linen as nn

        return nn.LogicallyPartitioned(array, names)

    def contract_problems(self, cls: type) -> list[str]:
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        return [f"it has no `{f}` field" for f in ("config", "param_dtype") if f not in fields]

    def model_problems(self, model: Any) -> list[str]:
        return super().model_problems(model[0])


LINEN = LinenLibrary()
