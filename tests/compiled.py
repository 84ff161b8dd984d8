"""A native model's method called as one compiled program: called eagerly, JAX compiles and
dispatches each operation on its own (hundreds of programs for a small Swin; measured per
test by the number of backend compiles), which is most of such a test's time."""

from __future__ import annotations

from typing import Any

import jax

from zoo.libraries import library, native_interface


def call(model: Any, impl: str, method: str, x: Any, *, inputs: dict[str, Any] | None = None,
         **kwargs: Any) -> Any:
    """`native_interface(impl).call(model, method, x, inputs=inputs, **kwargs)`, compiled once
    in the JAX libraries (the model's arrays are arguments, its options static); PyTorch's
    called as it is."""
    api = native_interface(impl)
    if not library(impl).is_jax:
        return api.call(model, method, x, inputs=inputs, **kwargs)
    static, params, state = api.split(model)
    compiled = jax.jit(lambda arrays, x, more: api.call(api.merge(static, *arrays), method, x,
                                                        inputs=more, **kwargs))
    return compiled((params, state), x, inputs)
