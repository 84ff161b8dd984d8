"""A small uniform functional interface over the three JAX libraries.

Tests and benchmarks use it so that they never special-case a library:

    api = zoo.interface("nnx")
    static, params, state = api.split(model)        # once, outside any timed region
    y, state = api.apply(static, params, state, api.to_native(x), train=True, key=key)

`params` is the differentiable pytree, `state` the BatchNorm statistics (or None), `static`
everything else. `apply` is pure: jit it with `static` closed over or marked static.
Inputs and outputs of `to_native` / `to_canonical` are batched, in the canonical channels-first
layout `(N, C, *spatial)`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import equinox as eqx
import jax
from flax import nnx


def _channels_last(x: jax.Array) -> jax.Array:
    return x if x.ndim <= 2 else x.transpose(0, *range(2, x.ndim), 1)


def _channels_first(x: jax.Array) -> jax.Array:
    return x if x.ndim <= 2 else x.transpose(0, x.ndim - 1, *range(1, x.ndim - 1))


class Interface:
    """split / merge / apply, plus layout changes between canonical and native inputs."""

    impl: ClassVar[str]
    channels_last: ClassVar[bool]

    def split(self, model: Any) -> tuple[Any, Any, Any]:
        raise NotImplementedError

    def merge(self, static: Any, params: Any, state: Any) -> Any:
        raise NotImplementedError

    def apply(self, static: Any, params: Any, state: Any, x: jax.Array, *, train: bool = False,
              key: jax.Array | None = None) -> tuple[jax.Array, Any]:
        raise NotImplementedError

    def to_native(self, x: jax.Array) -> jax.Array:
        return _channels_last(x) if self.channels_last else x

    def to_canonical(self, y: jax.Array) -> jax.Array:
        return _channels_first(y) if self.channels_last else y


class EqxInterface(Interface):
    """Per-sample models batched with `jax.vmap(axis_name="batch")`; one dropout key per sample.
    """

    impl = "eqx"
    channels_last = False

    def split(self, model: Any) -> tuple[Any, Any, Any]:
        model, state = model if isinstance(model, tuple) else (model, None)
        params, static = eqx.partition(model, eqx.is_inexact_array)
        return static, params, state

    def merge(self, static: Any, params: Any, state: Any) -> Any:
        model = eqx.combine(params, static)
        return model if state is None else (model, state)

    def apply(self, static, params, state, x, *, train=False, key=None):
        model = eqx.combine(params, static)
        if not train:
            model = eqx.nn.inference_mode(model)
        keys = None if key is None else jax.random.split(key, x.shape[0])
        if state is not None:  # a fresh handle: the caller's state stays usable (pure apply)
            leaves, treedef = jax.tree.flatten(state)
            state = jax.tree.unflatten(treedef, leaves)
        if state is None:
            y = jax.vmap(lambda xi, ki: model(xi, key=ki))(x, keys)
            return y, None
        return jax.vmap(lambda xi, ki: model(xi, state, key=ki), axis_name="batch",
                        out_axes=(0, None))(x, keys)


class LinenInterface(Interface):
    """`module.apply` with the non-`params` collections as state (mutable in training)."""

    impl = "linen"
    channels_last = True

    def split(self, model: Any) -> tuple[Any, Any, Any]:
        module, variables = model
        state = {k: v for k, v in variables.items() if k != "params"} or None
        return module, variables["params"], state

    def merge(self, static: Any, params: Any, state: Any) -> Any:
        return static, {"params": params, **(state or {})}

    def apply(self, static, params, state, x, *, train=False, key=None):
        variables = {"params": params, **(state or {})}
        rngs = None if key is None else {"dropout": key}
        if train and state:
            y, updates = static.apply(variables, x, train=True, rngs=rngs, mutable=list(state))
            return y, dict(updates)
        return static.apply(variables, x, train=train, rngs=rngs), state


class NNXInterface(Interface):
    """`nnx.split(model, nnx.Param, ...)`: params, then everything else (BatchStat) as state."""

    impl = "nnx"
    channels_last = True

    def split(self, model: Any) -> tuple[Any, Any, Any]:
        return nnx.split(model, nnx.Param, ...)

    def merge(self, static: Any, params: Any, state: Any) -> Any:
        return nnx.merge(static, params, state)

    def apply(self, static, params, state, x, *, train=False, key=None):
        model = nnx.merge(static, params, state, copy=True)  # never mutate the caller's state
        model.train() if train else model.eval()
        y = model(x) if key is None else model(x, rngs=key)
        return y, nnx.split(model, nnx.Param, ...)[2]


INTERFACES: dict[str, Interface] = {
    i.impl: i for i in (EqxInterface(), LinenInterface(), NNXInterface())
}


def interface(impl: str) -> Interface:
    """The functional interface of a JAX implementation ("eqx", "linen" or "nnx")."""
    if impl not in INTERFACES:
        raise ValueError(f"no functional interface for {impl!r}; JAX impls: {list(INTERFACES)}")
    return INTERFACES[impl]
