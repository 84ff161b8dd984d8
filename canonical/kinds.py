"""A layer kind is one object: which native classes it covers in each library, which arrays
they hold, how those map to the canonical layout and back, the canonical initialisation, and
which canonical arrays are statistics rather than trained parameters.

Walkers (`canonical.walkers`), the canonical initialisation (`zoo.weights.init`) and optimizer-state
conversion (`converters.optim`) consult the kind and nothing else, so a new kind is one
`register_kind(LayerKind(...))` call (see `canonical.rules` for the built-in ones).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from canonical.layouts import layout

Arrays = dict[str, Any]


@dataclass(frozen=True)
class Layer:
    """One layer found in a model: its canonical name, kind, native path, the shape of the
    feature map flattened into it (linear layers fed by a flatten, else None) and the facts
    its rules need beyond the arrays (the kind's `facts`, e.g. the number of heads)."""

    name: str  # canonical prefix, e.g. "fc1" or "convs.0"
    kind: str
    path: tuple[str, ...] = ()  # the native path when it differs from the name (Linen lists)
    flatten_shape: tuple[int, ...] | None = None  # (C, *spatial) of a flattened input
    facts: tuple[tuple[str, Any], ...] = ()  # sorted (name, value) pairs

    def fact(self, name: str) -> Any:
        """The fact `name` read from the native layer (a KeyError names a missing one)."""
        found = dict(self.facts)
        if name not in found:
            raise KeyError(f"layer {self.name!r} ({self.kind}) carries no fact {name!r}; "
                           f"it has {sorted(found)}")
        return found[name]


Rule = Callable[[str, Arrays, Layer], Arrays]
Init = Callable[[dict[str, tuple[int, ...]], np.random.Generator], Arrays]


def _identity(family: str, arrays: Arrays, layer: Layer) -> Arrays:
    return dict(arrays)


@dataclass(eq=False)
class LayerKind:
    """Everything the converters, the walkers and the initialisation know about a layer type.

    **Arguments:**
    - `name`: the kind's name ("linear", "batch_norm", ...).
    - `classes`: per implementation ("eqx", "linen", "nnx", "torch"), the native classes (or
      dotted names, imported when first needed) this kind covers, subclasses included.
    - `native`: per family ("eqx", "flax", and "torch" for a PyTorch layer whose arrays are
      not already canonical), the names of the arrays a native layer holds, optional ones
      included (a dotted name reaches into a sub-layer of a composite kind).
    - `to_native`, `to_canonical`: `rule(family, arrays, layer) -> arrays`, exact inverses
      (transposes, flips, reshapes, slices and concatenations only). PyTorch's layout is the
      canonical one: the rules see family "torch" only when `native` names it.
    - `init(shapes, rng) -> arrays`: the canonical initialisation of the layer's canonical
      arrays, given their shapes (keys without the layer prefix).
    - `stats`: native names of running statistics (Linen's `batch_stats` collection, an
      Equinox `StateIndex`, NNX `BatchStat`), in the order the Equinox state holds them.
    - `buffers`: canonical names that are statistics: never trained, not in optimizer states.
    - `composite`: the walkers do not look inside the layer (its sub-layers are its arrays).
    - `check(module, impl, name)`: refuse a native layer the rules cannot express.
    - `facts(module, impl) -> {name: value}`: hyper-parameters the rules need that the
      canonical arrays do not show (hashable values), carried by the `Layer`.
    - `axes`: per family, the logical axis names of each native array, one per dimension
      ("embed", "mlp", "heads", "kv", "conv_in", "conv_out", "channels", "vocab"; None for an
      axis never sharded; `...` for the kernel's spatial axes, however many): what sharding
      strategies (`zoo.runtime.sharding`) map onto mesh axes. Arrays it does not name are
      replicated.
    """

    name: str
    classes: Mapping[str, tuple[type | str, ...]]
    native: Mapping[str, tuple[str, ...]]
    init: Init
    to_native: Rule = _identity
    to_canonical: Rule = _identity
    stats: tuple[str, ...] = ()
    buffers: tuple[str, ...] = ()
    composite: bool = False
    check: Callable[[Any, str, str], None] | None = None
    facts: Callable[[Any, str], Mapping[str, Any]] | None = None
    axes: Mapping[str, Mapping[str, tuple[Any, ...]]] = field(default_factory=dict)
    _resolved: dict[str, tuple[type, ...]] = field(default_factory=dict, repr=False)

    def native_names(self, family: str) -> tuple[str, ...]:
        return self.native.get(family, ())

    def logical_axes(self, family: str, name: str, ndim: int) -> tuple[str | None, ...]:
        """The logical axis names of native array `name` of rank `ndim` (all None when the
        table names none; a ValueError names a table entry that does not fit the rank)."""
        table = self.axes.get(family, {}).get(name)
        if table is None:
            return (None,) * ndim
        spatial = ndim - (len(table) - 1) if ... in table else 0
        out = tuple(a for t in table for a in ((None,) * spatial if t is ... else (t,)))
        if len(out) != ndim or spatial < 0:
            raise ValueError(f"{self.name} kind: logical axes {table} of {family} array "
                             f"{name!r} do not fit its rank {ndim}")
        return out

    def resolved_classes(self, impl: str) -> tuple[type, ...]:
        """The native classes of `impl`, importing dotted names on first use; a library that
        is not installed contributes none."""
        if impl not in self._resolved:
            out = []
            for c in self.classes.get(impl, ()):
                if isinstance(c, str):
                    module, _, attr = c.rpartition(".")
                    try:
                        c = getattr(importlib.import_module(module), attr)
                    except ImportError:
                        continue
                out.append(c)
            self._resolved[impl] = tuple(out)
        return self._resolved[impl]

    def convert(self, family: str, arrays: Arrays, layer: Layer, *, to: str) -> Arrays:
        """`to_native` (to="native") or `to_canonical` (to="canonical"); identity for torch
        unless the kind names PyTorch arrays of its own (`native["torch"]`)."""
        if layout(family).canonical and family not in self.native:
            return dict(arrays)
        rule = self.to_native if to == "native" else self.to_canonical
        return rule(family, arrays, layer)


KINDS: dict[str, LayerKind] = {}
_BY_CLASS: dict[str, dict[type, LayerKind]] = {}
_CHANGES = [0]  # registrations so far: what the walkers' memos of found layers depend on


def generation() -> int:
    """A number that changes whenever a kind or a class is (un)registered."""
    return _CHANGES[0]


def register_kind(kind: LayerKind) -> LayerKind:
    """Add (or replace) a layer kind; its classes take precedence over older registrations."""
    KINDS[kind.name] = kind
    _BY_CLASS.clear()
    _CHANGES[0] += 1
    return kind


def unregister_kind(name: str) -> None:
    """Remove a layer kind (tests that register toy kinds clean up with it)."""
    KINDS.pop(name, None)
    _BY_CLASS.clear()
    _CHANGES[0] += 1


def register_class(kind: str, impl: str, cls: type | str) -> None:
    """Let kind `kind` also cover native class `cls` of `impl` (e.g. a custom Equinox layer
    with the same arrays as the library's)."""
    k = KINDS[kind]
    k.classes = {**k.classes, impl: (*k.classes.get(impl, ()), cls)}
    k._resolved.pop(impl, None)
    _BY_CLASS.clear()
    _CHANGES[0] += 1


def kind_of(module: Any, impl: str) -> LayerKind | None:
    """The kind covering `module` (the most derived registered class wins), or None."""
    if impl not in _BY_CLASS:
        _BY_CLASS[impl] = {c: k for k in KINDS.values() for c in k.resolved_classes(impl)}
    table = _BY_CLASS[impl]
    return next((table[c] for c in type(module).__mro__ if c in table), None)
