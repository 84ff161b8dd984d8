"""Equinox: per-sample, channels-first models; BatchNorm statistics in an `eqx.nn.State`."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import equinox as eqx
import jax
import jax.numpy as jnp

from canonical.walkers import EqxWalker
from zoo.configs import Config
from zoo.interface import EqxInterface
from zoo.libraries.library import Library


class EqxModel(Protocol):
    """An Equinox model class: `cls(config, *, key, dtype)`, an `eqx.Module` keeping `config`
    as a static field; `has_state = True` when it holds an `eqx.nn.StateIndex` (then it is built
    with `eqx.nn.make_with_state` and called as `model(x, state)`). Its static part (everything
    but the arrays) is hashable, so `jax.jit(api.apply, static_argnums=0)` works: tuples, not
    lists, of sub-modules."""

    config: Config
    has_state: ClassVar[bool]

    def __init__(self, config: Config, *, key: jax.Array, dtype: Any = None) -> None: ...


class EqxLibrary(Library):
    name = "eqx"
    package = "equinox"
    checkpoint_format = "eqx"
    abstract_skeleton = True
    walker = EqxWalker()
    interface = EqxInterface()
    lora = "zoo.lora.eqx"
    contract = EqxModel
    rng_argument = "key"
    dtype_argument = "dtype"

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, eqx.Module) or (
            isinstance(obj, tuple) and bool(obj) and isinstance(obj[0], eqx.Module))

    def native_init(self, cls: type, config: Config, key: jax.Array, dtype: Any) -> Any:
        dt = jnp.dtype(dtype)
        if getattr(cls, "has_state", False):
            return eqx.nn.make_with_state(cls)(config, key=key, dtype=dt)
        return cls(config, key=key, dtype=dt)

    def skeleton(self, cls: type, config: Config, dtype: Any) -> Any:
        return eqx.filter_eval_shape(self.native_init, cls, config, jax.random.key(0), dtype)

    def constrain(self, tree: Any, where: Any) -> Any:
        """Equinox's idiom: `eqx.filter_shard`, which constrains the array leaves of any pytree
        (a model, a batch) and passes the others through."""
        return eqx.filter_shard(tree, where)

    def model_problems(self, model: Any) -> list[str]:
        static = self.interface.split(model)[0]
        problems = super().model_problems(static)
        module = model[0] if isinstance(model, tuple) else model
        is_index = lambda x: isinstance(x, eqx.nn.StateIndex)
        if not getattr(module, "has_state", False) and any(
                is_index(x) for x in jax.tree.leaves(module, is_leaf=is_index)):
            problems.append("it holds an eqx.nn.StateIndex but does not set `has_state = True`")
        try:
            hash(static)
        except TypeError as e:
            problems.append(f"its static part is not hashable ({e}; use tuples, not lists, of "
                            "sub-modules)")
        return problems


EQX = EqxLibrary()
