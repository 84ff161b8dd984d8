"""Foreign trees as layers: any model or checkpoint tree, whatever its names, grouped into
layers of candidate kinds by the arrays they hold (the layer kinds' native names per family).

A flat tree `{dotted key: array}` of one family ("torch", "flax", "eqx") is grouped by the
key's last part: `0.weight`, `params.Conv_0.kernel`, `linear1.kernel.value` give layers `0`,
`Conv_0`, `linear1`. Flax collections (`params`, `batch_stats`) and NNX's `.value` suffix are
not part of a layer's name; NNX random-number state (`rngs`) is no weight and is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

import canonical
from canonical.kinds import KINDS, Layer
from canonical.layouts import layout
from canonical.paths import key_name
from canonical.torch_arrays import torch_to_numpy

COLLECTIONS = ("params", "batch_stats")
SKIPPED = ("rngs",)  # NNX random-number streams: state, not weights


@dataclass
class SourceLayer:
    """One layer of a foreign tree: its key (dotted path), family, native arrays (leaf name ->
    array) and the kinds its arrays fit, most specific first."""

    key: str
    family: str
    arrays: dict[str, Any]
    kinds: tuple[str, ...]
    index: int = 0  # position in the source (definition order when `ordered`)
    canonical_kind: str | None = None  # the arrays are that composite kind's canonical ones
    _shapes: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def canonical(self, kind: str, flatten_shape: tuple[int, ...] | None = None
                  ) -> dict[str, Any]:
        """The layer's arrays in the canonical layout, read as a layer of `kind`."""
        if kind == self.canonical_kind:
            return dict(self.arrays)
        layer = Layer(self.key, kind, flatten_shape=flatten_shape)
        return KINDS[kind].convert(self.family, dict(self.arrays), layer, to="canonical")

    def shapes(self, kind: str) -> dict[str, tuple[int, ...]] | None:
        """Canonical shapes as a `kind` layer, or None if the arrays do not fit that kind
        (computed once per kind)."""
        if kind not in self._shapes:
            try:
                got = {k: tuple(np.shape(v)) for k, v in self.canonical(kind).items()}
            except (KeyError, ValueError, TypeError, AttributeError, IndexError):
                got = None
            self._shapes[kind] = got
        return None if self._shapes[kind] is None else dict(self._shapes[kind])


def _names(kind: str, family: str) -> set[str]:
    """Native array names of a kind in a family (torch: the canonical names)."""
    k = KINDS[kind]
    if not layout(family).canonical:
        return set(k.native_names(family))
    eqx = set(k.native_names("eqx")) - set(k.stats)
    return eqx | set(k.buffers)


def candidate_kinds(leaves: set[str], family: str) -> tuple[str, ...]:
    """Kinds whose native names cover `leaves` (all required arrays present is checked by the
    shapes), most specific (fewest names) first; bare parameters are not guessed."""
    fits = [(len(_names(k, family)), k) for k in KINDS
            if k != "parameter" and leaves and leaves <= _names(k, family)]
    return tuple(k for _, k in sorted(fits))


def _numpy(v: Any) -> np.ndarray:
    return torch_to_numpy(v) if hasattr(v, "detach") else np.asarray(v)


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key reading digit runs as numbers: `Dense_2` < `Dense_10`, `layers.2` < `layers.10`."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def from_flat(flat: Mapping[str, Any], family: str, *, ordered: bool) -> list[SourceLayer]:
    """The layers of a flat `{dotted key: array}` tree of `family` ("torch", "flax", "eqx").

    `ordered`: the keys come in definition order (a torch state_dict); otherwise layers are
    put in natural order of their names (orbax and safetensors store keys sorted).
    """
    groups: dict[str, dict[str, Any]] = {}
    bare: set[str] = set()
    for key, value in flat.items():
        parts = key.split(".")
        if layout(family).collections:
            if parts[0] in COLLECTIONS:
                parts = parts[1:]
            if len(parts) > 1 and parts[-1] == "value":
                parts = parts[:-1]
            if any(p in SKIPPED for p in parts):
                continue
        if len(parts) < 2:  # a bare array (a class token): a layer of kind "parameter"
            bare.add(".".join(parts))
            groups[".".join(parts)] = {"": _numpy(value)}
            continue
        groups.setdefault(".".join(parts[:-1]), {})[parts[-1]] = _numpy(value)
    names = list(groups) if ordered else sorted(groups, key=natural_key)
    out = []
    for i, name in enumerate(names):
        kinds = ("parameter",) if name in bare else candidate_kinds(set(groups[name]), family)
        out.append(SourceLayer(name, family, groups[name], kinds, i))
    return out


def merge_composites(sources: list[SourceLayer], targets: list[Any]) -> list[SourceLayer]:
    """`sources` of a flat PyTorch-layout tree regrouped where the target's layers are not
    grouped by a key's last part, as a state dict in the canonical layout holds them (the
    zoo's own, or a foreign one renamed by its adapter): the layers under a composite target
    layer (an attention layer's `qkv` and `proj`) merged into one when together they hold
    exactly its canonical arrays, and an array that is a target's bare parameter under a
    module's name (LayerScale's `ls1.gamma`) taken as that parameter."""
    out = list(sources)
    bare = {t.name for t in targets if t.kind == "parameter"}
    for i, s in enumerate(out):
        leaf = next(iter(s.arrays)) if len(s.arrays) == 1 else ""
        if layout(s.family).canonical and not s.kinds and f"{s.key}.{leaf}" in bare:
            out[i] = SourceLayer(f"{s.key}.{leaf}", s.family, {"": s.arrays[leaf]},
                                 ("parameter",), s.index)
    for t in targets:
        if not KINDS[t.kind].composite:
            continue
        under = [s for s in out if layout(s.family).canonical
                 and s.key.startswith(t.name + ".")]
        arrays = {f"{s.key[len(t.name) + 1:]}.{leaf}": a for s in under
                  for leaf, a in s.arrays.items()}
        if not under or set(arrays) != set(t.shapes):
            continue
        merged = SourceLayer(t.name, under[0].family, arrays, (t.kind,),
                             min(s.index for s in under),
                             canonical_kind=t.kind)
        out = [s for s in out if s not in under] + [merged]
    return sorted(out, key=lambda s: s.index)


def flatten_tree(tree: Any) -> dict[str, Any]:
    """A nested tree (dicts, lists, NNX states) as `{dotted key: leaf}`."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {".".join(key_name(k) for k in path): leaf for path, leaf in flat}


def from_model(model: Any, impl: str, *, example: Any = None) -> list[SourceLayer]:
    """The layers of a live native model found by the walkers (any model of supported layers,
    not only the zoo's), in the walker's order: definition order (Equinox, NNX, PyTorch), call
    order (Linen)."""
    w = canonical.state.walker(impl)
    found = w.layers(model, example=example)
    native = w.read(model, found)
    return [SourceLayer(layer.name, w.family, {k: np.asarray(v) for k, v in
                                                       native[layer.name].items()},
                        (layer.kind,), i) for i, layer in enumerate(found)]
