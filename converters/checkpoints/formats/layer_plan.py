"""Native arrays made layer by layer as a writer takes them, through the layer rules.

`plan` says where each native array of each layer sits in a library's stored tree; a tree
of `Pending` leaves (`native_leaves`, placed by the walker) runs each layer's rule (to native,
on NumPy views of the host arrays) when its first array is taken, so a writer that takes the
arrays one by one never holds a native model nor a second copy of the checkpoint (orbax
directories, Equinox files). A reader goes the other way with `canonical_state`: the stored
arrays by path, each layer through its rule to the canonical layout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

import canonical
from canonical import KINDS, ConversionError, Layer
from canonical.paths import join, key_name
from canonical.state import split_by_layer
from converters.checkpoints.checkpoint import spread
from converters.checkpoints.io import detached

Arrays = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """Where each native array of each layer sits in a library's stored tree."""

    impl: str
    layers: list[Layer]
    native: dict[str, dict[str, jax.ShapeDtypeStruct]]  # layer -> name -> abstract array
    paths: dict[tuple[str, str], tuple[str, ...]]  # (layer, name) -> stored path

    @property
    def family(self) -> str:
        return canonical.walker(self.impl).family


class Marker:
    """A placeholder leaf naming (layer, native array name)."""

    def __init__(self, layer: str, name: str):
        self.key = (layer, name)


def plan(skel: Any, impl: str, facts: Mapping[str, Any],
         stored: Callable[[Any], Any]) -> Plan:
    """The plan of the abstract `skel`; `stored(model)` is the tree the format stores (the
    walker places a marker for every array; `skel` is filled with them and spent)."""
    w = canonical.walker(impl)
    found = canonical.layers(skel, impl, **facts)
    native = w.read(skel, found)
    native = {k: {n: jax.ShapeDtypeStruct(a.shape, a.dtype) for n, a in v.items()}
              for k, v in native.items()}
    model = w.write(skel, {layer: {n: Marker(layer, n) for n in arrays}
                           for layer, arrays in native.items()}, found)
    flat = jax.tree_util.tree_flatten_with_path(stored(model))[0]
    paths = {m.key: tuple(key_name(k) for k in p) for p, m in flat if isinstance(m, Marker)}
    lost = [f"{layer}.{n}" for layer, arrays in native.items() for n in arrays
            if (layer, n) not in paths]
    if lost:
        raise ConversionError(f"the stored {impl} tree has no place for {lost[:5]}")
    return Plan(impl, found, native, paths)


class LayerSource:
    """One layer's canonical arrays, converted to native ones on first use; each native array
    is handed out once and then dropped."""

    def __init__(self, p: Plan, layer: Layer, arrays: Arrays, advance: Callable[[int], None]):
        self.plan, self.layer, self.arrays, self.advance = p, layer, arrays, advance
        self.native: Arrays | None = None

    def convert(self) -> Arrays:
        """The layer's native arrays: on the host, the rule runs on NumPy arrays (its
        transposes are views, copied once as orbax writes them); arrays on devices stay
        there."""
        on_host = not any(isinstance(a, jax.Array) for a in self.arrays.values())
        w = canonical.walker(self.plan.impl)
        arrays = {k: host_array(v) if on_host else w.as_native_array(v)
                  for k, v in self.arrays.items()}
        return KINDS[self.layer.kind].convert(self.plan.family, arrays, self.layer,
                                              to="native")

    def take(self, name: str) -> np.ndarray:
        if self.native is None:
            self.native, self.arrays = self.convert(), {}
        out = np.asarray(self.native.pop(name))
        self.advance(out.nbytes)
        return out


def host_array(a: Any) -> np.ndarray:
    """`a` on the host with the dtype JAX would give it (`jnp.asarray`'s, e.g. float32 for
    float64 without x64): what the library's model would hold, bit for bit."""
    a = np.asarray(a)
    return a.astype(jax.dtypes.canonicalize_dtype(a.dtype), copy=False)


class Pending:
    """A native array made when a writer (orbax, Equinox's record stream) takes it."""

    def __init__(self, source: LayerSource, name: str, spec: jax.ShapeDtypeStruct):
        self.source, self.name = source, name
        self.shape, self.dtype = tuple(spec.shape), np.dtype(spec.dtype)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def take(self) -> np.ndarray:
        return self.source.take(self.name)


def native_leaves(p: Plan, state: Mapping[str, Any], advance: Callable[[int], None]
                  ) -> dict[str, Arrays]:
    """Per layer, per native name: a `Pending` array, or the native array itself where the
    layer's canonical arrays are spread over devices already (converted there, orbax writes
    each device's shards)."""
    # mapped arrays are read afresh when converted: their pages never stay resident
    grouped = split_by_layer({k: detached(v) for k, v in state.items()}, p.layers)
    out = {}
    for layer in p.layers:
        source = LayerSource(p, layer, grouped[layer.name], advance)
        if any(spread(a) for a in grouped[layer.name].values()):
            out[layer.name] = source.convert()
            advance(sum(a.nbytes for a in out[layer.name].values()))
        else:
            out[layer.name] = {n: Pending(source, n, s)
                               for n, s in p.native[layer.name].items()}
    return out


def canonical_state(p: Plan, stored: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """The canonical state of the native arrays at the plan's stored paths (`stored`: path ->
    array, every one the plan has), each layer converted by its rule (on whatever arrays it
    is given: memory maps stay maps where the rule only views them)."""
    where = {path: key for key, path in p.paths.items()}
    native: dict[str, Arrays] = {layer.name: {} for layer in p.layers}
    for path, a in stored.items():
        layer, name = where[path]
        native[layer][name] = a
    out = {}
    for layer in p.layers:
        converted = KINDS[layer.kind].convert(p.family, native[layer.name], layer,
                                              to="canonical")
        out.update((join(layer.name, k), v) for k, v in converted.items())
    return out
