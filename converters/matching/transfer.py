"""Bring your own checkpoint: move the weights of a foreign model or tree into a zoo
architecture (`import_state`) or into a user's own model skeleton (`transfer`), matched by
`converters.matching.match` and verified on the spot where both sides can run.

The shape of a conv map flattened into a linear layer (`converters.matching.flatten`) comes
from the zoo config where there is one, else from `flatten_shape=`, else it is traced through a
model's reshape or guessed, and the table says which; a wrong one fails the verification.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import canonical
from canonical.errors import ConversionError
from canonical.layouts import layout
from canonical.paths import join
from converters import adapters
from converters.matching import verify as checks
from converters.matching.flatten import abstract_input_of, find_flatten, needs_flatten
from converters.matching.match import Row, TargetLayer, match
from converters.matching.sources import (
    SourceLayer,
    flatten_tree,
    from_flat,
    from_model,
    merge_composites,
)
from zoo.configs import Config, warn_padding
from zoo.libraries import IMPLS, library, native_interface
from zoo.registry import schema


@dataclass
class Result:
    """What a matched conversion did: the table, the canonical state under the target's
    names, where the flatten shape came from, and the verification (None: not run)."""

    rows: list[Row]
    state: dict[str, Any]
    model: Any = None
    flatten_shape: tuple[int, ...] | None = None
    flatten_from: str = ""  # "config", "argument", "guessed" or "" (no flattened map)
    max_difference: float | None = None
    tolerance: float | None = None
    notes: list[str] = field(default_factory=list)
    compared: str = ""  # what ran against what: the source itself, or two zoo libraries
    source_ran: bool = False  # the source model itself ran (the mapping is verified)

    @property
    def structural(self) -> bool:
        """Some layer was matched by something else than its exact name."""
        return any(r.rule != "name" for r in self.rows)


def _is_flat(tree: Mapping[str, Any]) -> bool:
    return all(isinstance(k, str) and not isinstance(v, Mapping) for k, v in tree.items())


def source_layers(src: Any, impl: str, *, input_shape: tuple[int, ...] | None = None
                  ) -> tuple[list[SourceLayer], bool]:
    """(layers, ordered) of a source: a live native model of `impl`, or a tree of its arrays
    (a torch state_dict with any key names, Linen variables, an NNX state, nested dicts)."""
    if impl not in IMPLS:
        raise ConversionError(f"unknown implementation {impl!r}; available: {list(IMPLS)}")
    family = library(impl).family
    walker = canonical.walker(impl)
    if _is_tree(src):
        flat = dict(src) if isinstance(src, Mapping) and _is_flat(src) else flatten_tree(src)
        ordered = walker.ordered_flat_trees and isinstance(src, Mapping) and _is_flat(src)
        return from_flat(flat, family, ordered=ordered), ordered
    if walker.needs_example:
        if input_shape is None:  # no input to trace the model with: its arrays suffice
            return source_layers(native_interface(impl).checkpoint_tree(src), impl)
        return from_model(src, impl, example=abstract_input_of(input_shape, impl)), True
    return from_model(src, impl), walker.ordered


def _is_tree(src: Any) -> bool:
    """A tree of arrays (a state_dict, Linen variables, an NNX state), not a runnable model."""
    from flax import nnx

    return isinstance(src, Mapping | nnx.State)


def warn_source_padding(src_impl: str, config: Config | None) -> None:
    """Weights the zoo did not write, from a library whose convolutions pad SAME unless told
    otherwise (Flax), going into a config that pads as PyTorch: one `PaddingWarning` line
    naming the config field and the flag (the weights do not carry the padding)."""
    if config is not None and library(src_impl).pads_same:
        warn_padding(config, f"the source is a {src_impl} model the zoo did not build (Flax "
                             "convolutions pad SAME unless given explicit pads)", stacklevel=3)


def _targets(found: list[canonical.Layer], spec: Mapping[str, Any]) -> list[TargetLayer]:
    shapes = {k: tuple(v.shape) for k, v in spec.items()}
    return [TargetLayer.of(layer, shapes) for layer in found]


def canonical_state(sources: list[SourceLayer], rows: list[Row], targets: list[TargetLayer]
                    ) -> dict[str, Any]:
    """The source's arrays in the canonical layout under the matched target names."""
    by_key, by_name = {s.key: s for s in sources}, {t.name: t for t in targets}
    state: dict[str, Any] = {}
    for r in rows:
        t = by_name[r.target]
        for k, v in by_key[r.source].canonical(t.kind, t.flatten_shape).items():
            state[join(t.name, k)] = np.asarray(v)
    return state


def import_state(src: Any, src_impl: str, config: Config, *, maps: Sequence[str] = (),
                 strip: str = "", add: str = "", ordered: bool | None = None,
                 verify_with: str | None = None) -> Result:
    """The canonical state of zoo architecture `config` holding a foreign source's weights
    (see `source_layers` for what `src` may be). The flatten shape is the config's.

    `verify_with`: a library ("eqx", "linen", "nnx", "torch"); the zoo model of `src_impl` holding
    the source's arrays as they are and the one of `verify_with` run on the same random input
    (a wrong layout or flatten order shows there). `ordered` overrides the source's order fact.
    A PyTorch-layout state dict in a foreign layout an adapter knows (`converters.adapters`:
    HF transformers, big_vision, ...) is renamed first, as the command line and
    `converters.load` do (`Result.notes` name the layout).
    """
    notes: list[str] = []
    if layout(library(src_impl).family).canonical and isinstance(src, Mapping) and _is_flat(src):
        # a foreign layout (HF transformers, big_vision, ...): its keys renamed as the
        # checkpoint readers do (the command line, `converters.load`)
        renamed, adapter, notes = adapters.to_canonical_names(src, config.arch)
        if adapter is not None:
            src = renamed
            notes = [f"layout: {adapter.description} ({adapter.name}), keys renamed and fused "
                     "by its declared rules", *notes]
    sources, is_ordered = source_layers(src, src_impl)
    warn_source_padding(src_impl, config)
    found, spec = schema(config)
    targets = _targets(found, spec)
    sources = merge_composites(sources, targets)
    rows = match(sources, targets, maps=maps, strip=strip, add=add,
                 ordered=is_ordered if ordered is None else ordered)
    state = canonical_state(sources, rows, targets)
    res = Result(rows, state, flatten_shape=config.flatten_shape,
                 flatten_from="config" if config.flatten_shape else "", notes=notes)
    if verify_with is not None:
        from converters.core import from_canonical

        x = checks.sample_input(config)
        other = verify_with if verify_with != src_impl else next(  # another library
            i for i in sorted(IMPLS, key=lambda i: not library(i).reference) if i != src_impl)
        ref = checks.forward(from_canonical(state, config, src_impl), src_impl, x, config)
        out = checks.forward(from_canonical(state, config, other), other, x, config)
        _check(res, ref, out, f"the zoo's {src_impl} and {other} models holding the arrays")
    return res


def _check(res: Result, ref: np.ndarray, out: np.ndarray, what: str) -> None:
    res.max_difference, res.tolerance = checks.max_difference(ref, out), checks.tolerance()
    res.compared = what
    if not res.max_difference <= res.tolerance:
        hint = ("" if res.flatten_from in ("config", "argument") else
                f" (the flattened map's shape was {res.flatten_from or 'not found'}: if a conv "
                "map feeds a linear layer, pass flatten_shape=(C, *spatial), or input_shape= "
                "to trace it)")
        raise ConversionError(
            f"verification failed: the outputs of {what} differ by {res.max_difference:.3g} "
            f"(max |a - b| / max |a|), above the tolerance {res.tolerance:.3g}{hint}; nothing "
            "was written. Mapping:\n" + "\n".join(
                f"  {r.source} -> {r.target} ({r.rule})" for r in res.rows))


def transfer(src: Any, src_impl: str, dst_model: Any, dst_impl: str, *,
             maps: Sequence[str] = (), strip: str = "", add: str = "",
             input_shape: tuple[int, ...] | None = None,
             flatten_shape: tuple[int, ...] | None = None, verify: bool | None = None,
             ordered: bool | None = None) -> Result:
    """Move the weights of `src` (a model or tree of `src_impl`) into `dst_model`, a model (or
    skeleton) of `dst_impl` that need not come from the zoo; `Result.model` is the new model.

    `input_shape`: one sample's shape, channels first (needed to trace a Linen target and to
    verify when the first layer is not linear). `flatten_shape`: the `(C, *spatial)` map fed
    into the first linear layer after the convolutions, when it cannot be guessed. `verify`
    (default: when `src` is a runnable model): run both on the same random input and refuse a
    difference above the precision policy's tolerance. `ordered` overrides the source's order fact.
    """
    config = _zoo_config(dst_model)  # a zoo target knows its input and flattened map
    if config is not None and input_shape is None:
        input_shape = config.input_shape
    if _zoo_config(src) is None:  # a zoo source's config says how it pads
        warn_source_padding(src_impl, config)
    sources, is_ordered = source_layers(src, src_impl, input_shape=input_shape)
    ordered = is_ordered if ordered is None else ordered
    example = None if input_shape is None else abstract_input_of(input_shape, dst_impl)
    if canonical.walker(dst_impl).needs_example and example is None:
        raise ConversionError(f"a {dst_impl} target is traced to find its layers: pass "
                              "input_shape= (one sample, channels first)")
    found = canonical.layers(dst_model, dst_impl, example=example)
    targets = _targets(found, canonical.spec(dst_model, dst_impl, example=example))
    origin = "argument" if flatten_shape is not None else ""
    if flatten_shape is None and config is not None and config.flatten_shape is not None:
        flatten_shape, origin = config.flatten_shape, "config"
    if flatten_shape is None and needs_flatten(src_impl, dst_impl):
        flatten_shape, origin = find_flatten(src, src_impl, dst_model, dst_impl, targets,
                                             input_shape, lambda m: not _is_tree(m))
    if flatten_shape is not None:
        facts = {"example": example, "flatten_shape": tuple(flatten_shape)}
        found = canonical.layers(dst_model, dst_impl, **facts)
        targets = _targets(found, canonical.spec(dst_model, dst_impl, **facts))
    rows = match(sources, targets, maps=maps, strip=strip, add=add, ordered=ordered)
    state = canonical_state(sources, rows, targets)
    model = canonical.write(native_interface(dst_impl).clone(dst_model), state, dst_impl,
                            example=example, flatten_shape=flatten_shape)
    res = Result(rows, state, model, flatten_shape, origin)
    runnable = not _is_tree(src)
    if verify is None:
        verify = runnable
    if verify:
        if not runnable:
            raise ConversionError("verify=True needs a runnable source model, not a tree of "
                                  "arrays")
        shape = input_shape or _first_input(targets)
        if shape is None:
            res.notes.append("not verified: pass input_shape= (the first layer is no linear)")
            return res
        x = checks.random_input(tuple(shape))
        res.source_ran = True
        _check(res, checks.forward(src, src_impl, x), checks.forward(model, dst_impl, x),
               f"the {src_impl} source model itself and the {dst_impl} result")
    return res


def _zoo_config(model: Any) -> Config | None:
    config = getattr(model[0] if isinstance(model, tuple) else model, "config", None)
    return config if isinstance(config, Config) else None


def _first_input(targets: Sequence[TargetLayer]) -> tuple[int, ...] | None:
    first = targets[0] if targets else None
    if first is not None and first.kind == "linear":
        return (first.shapes["weight"][1],)
    return None
