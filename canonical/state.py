"""Whole models to canonical states and back, for any implementation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from canonical.errors import ConversionError
from canonical.kinds import KINDS, Layer
from canonical.paths import join
from canonical.walkers import PARAMETER, WALKERS, Walker, with_flatten


def walker(impl: str) -> Walker:
    if impl not in WALKERS:
        raise ConversionError(f"unknown implementation {impl!r}; available: {list(WALKERS)}")
    return WALKERS[impl]


def torch_order(found: list[Layer]) -> list[Layer]:
    """`found` (in definition order) in the order of PyTorch's `state_dict`: at every level of
    the names, a module's own bare parameters first, then its submodules, each in the order
    they first appear."""
    first: dict[tuple[str, ...], int] = {}
    for layer in found:
        parts = tuple(layer.name.split("."))
        for i in range(1, len(parts) + 1):
            first.setdefault(parts[:i], len(first))

    def position(layer: Layer) -> tuple[tuple[bool, int], ...]:
        parts = tuple(layer.name.split("."))
        own = layer.kind == PARAMETER
        return tuple((not (own and i == len(parts)), first[parts[:i]])
                     for i in range(1, len(parts) + 1))

    return sorted(found, key=position)


def layers(model: Any, impl: str, *, example: Any = None,
           flatten_shape: tuple[int, ...] | None = None) -> list[Layer]:
    """Every layer of a native model, each array accounted for (or a ConversionError), in the
    order of PyTorch's `state_dict` (`torch_order`).

    `example`: an abstract input in the model's layout (needed to trace Linen modules);
    `flatten_shape`: the (C, *spatial) map the model flattens into its first linear layer of
    that many inputs, if any.
    """
    w = walker(impl)
    found = torch_order(w.layers(model, example=example))
    if flatten_shape is None:
        return found
    return with_flatten(found, w.read(model, found), flatten_shape)


def read(model: Any, impl: str, **facts: Any) -> dict[str, Any]:
    """The canonical state of a native model (dtypes kept, nothing copied beyond the layout
    changes). For Equinox pass `(model, state)` when the model has state."""
    w = walker(impl)
    found = layers(model, impl, **facts)
    out: dict[str, Any] = {}
    for layer in found:
        native = w.read(model, [layer])[layer.name]
        for key, value in KINDS[layer.kind].convert(w.family, native, layer,
                                                    to="canonical").items():
            out[join(layer.name, key)] = value
    return out


def spec(skeleton: Any, impl: str, **facts: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """Canonical keys with shapes and dtypes of a skeleton (floats as held, counters int64), in
    `read`'s order (the abstract evaluation returns its dict sorted)."""
    order: list[str] = []

    def keys_and_arrays(model: Any) -> dict[str, Any]:
        state = read(model, impl, **facts)
        order[:] = state
        return state

    found = walker(impl).abstract(skeleton, keys_and_arrays)
    return {k: found[k] if jnp.issubdtype(found[k].dtype, jnp.floating) else
            jax.ShapeDtypeStruct(found[k].shape, np.int64) for k in order}


def split_by_layer(state: Mapping[str, Any], found: list[Layer]) -> dict[str, dict[str, Any]]:
    """Canonical arrays grouped by layer (keys without the layer prefix; the longest layer
    name that prefixes a key owns it; keys of no layer are left out)."""
    out: dict[str, dict[str, Any]] = {layer.name: {} for layer in found}
    for key, value in state.items():
        if key in out:  # a bare parameter: the key is the layer's name
            out[key][""] = value
            continue
        parts = key.split(".")
        for i in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in out:
                out[prefix][".".join(parts[i:])] = value
                break
    return out


def _array(value: Any) -> Any:
    """A numpy or JAX array as it is; anything else array-like (a lazy file slice) as numpy."""
    return value if isinstance(value, (np.ndarray, jax.Array)) else np.asarray(value)


def write(skeleton: Any, state: Mapping[str, Any], impl: str, **facts: Any) -> Any:
    """A native model of `impl`: `skeleton` (from `zoo.registry.skeleton` or any model of the
    same structure) holding the canonical `state`, which must fit it exactly."""
    w = walker(impl)
    found = layers(skeleton, impl, **facts)
    grouped = split_by_layer(state, found)
    # The layout rules run on host arrays as given (numpy from a file: no device program per
    # shape; lazy ones read now), then each result becomes the library's kind of array.
    native = {layer.name: {k: w.as_native_array(v) for k, v in KINDS[layer.kind].convert(
        w.family, {k: _array(v) for k, v in grouped[layer.name].items()}, layer,
        to="native").items()} for layer in found}
    return w.write(skeleton, native, found)
