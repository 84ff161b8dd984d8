"""Optimizer states between libraries: optax states whose subtrees mirror the parameters.

An optax state built by ``tx.init(params)`` (with ``params = zoo.interface(impl).split(model)[1]``)
is a tree of containers (tuples, NamedTuples, dicts) whose leaves are either

- subtrees with exactly the structure of ``params`` (Adam's ``mu`` and ``nu``, momentum traces,
  ...): they follow the parameter layout rules. Each is converted by putting it into the model in
  place of the parameters and calling ``to_canonical`` / ``from_canonical``;
- scalars (``count``, injected hyper-parameters): passed through unchanged.

Any other leaf (an array that is neither a scalar nor inside a parameter mirror) has no defined
layout and is refused with a `ConversionError`.

The canonical form, `CanonicalOptState`, is library-neutral: a JSON ``layout`` of the containers
(the same for every library given the same optimizer) and a flat dict of arrays:
``"<path>/<canonical key>"`` for mirrors (e.g. ``"0/mu/fc1.weight"``) and ``"<path>"`` for scalars
(e.g. ``"0/count"``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from canonical.paths import key_name as _key_name
from converters.core import (
    ConversionError,
    buffer_keys,
    canonical_spec,
    config_of,
    from_canonical,
    to_canonical,
)
from zoo.configs import Config
from zoo.libraries import interface

LEAF = "__leaf__"
EMPTY = "__empty__"
PARAMS_LEAF = {LEAF: "params"}


@dataclass
class CanonicalOptState:
    """A library-neutral optimizer state (see the module docstring)."""

    layout: Any
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def entries(self) -> list[tuple[str, dict[str, Any]]]:
        """(path, leaf marker) of every leaf of the layout, in order."""
        out: list[tuple[str, dict[str, Any]]] = []
        _visit_layout(self.layout, "", lambda p, m: out.append((p, m)))
        return out


def param_keys(config: Config) -> list[str]:
    """Canonical keys of the trainable parameters (the state minus the layer kinds' buffers)."""
    return list(_param_keys(config))


@functools.lru_cache(maxsize=64)
def _param_keys(config: Config) -> tuple[str, ...]:
    buffers = buffer_keys(config)
    return tuple(k for k in canonical_spec(config) if k not in buffers)


@functools.lru_cache(maxsize=64)
def _spec_shapes(config: Config) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in canonical_spec(config).items()}


def join(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


def is_array_leaf(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray | np.generic | jax.ShapeDtypeStruct | bool | int
                      | float)


def _children(node: Any) -> list[tuple[Any, Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return [(path[0], child) for path, child in flat]


def _empty_kind(node: Any) -> str:
    if isinstance(node, dict):
        return "dict"
    if isinstance(node, list | tuple) and not hasattr(node, "_fields"):
        return "list"
    return "none"


def describe(tree: Any, is_mirror: Callable[[Any], bool],
             on_mirror: Callable[[str, Any], None] | None = None,
             on_array: Callable[[str, Any], None] | None = None, path: str = "") -> Any:
    """The JSON layout of an optimizer state; calls `on_mirror` / `on_array` per leaf."""
    if is_mirror(tree):
        if on_mirror is not None:
            on_mirror(path, tree)
        return dict(PARAMS_LEAF)
    if is_array_leaf(tree):
        a = tree if isinstance(tree, jax.ShapeDtypeStruct) else np.asarray(tree)
        if on_array is not None:
            on_array(path, tree)
        return {LEAF: "array", "shape": list(a.shape), "dtype": np.dtype(a.dtype).name}
    children = _children(tree)
    if not children:
        return {EMPTY: _empty_kind(tree)}
    if all(isinstance(k, jax.tree_util.SequenceKey) for k, _ in children):
        return [describe(c, is_mirror, on_mirror, on_array, join(path, _key_name(k)))
                for k, c in children]
    return {_key_name(k): describe(c, is_mirror, on_mirror, on_array, join(path, _key_name(k)))
            for k, c in children}


def _visit_layout(layout: Any, path: str, fn: Callable[[str, dict[str, Any]], None]) -> None:
    if isinstance(layout, dict) and LEAF in layout:
        fn(path, layout)
    elif isinstance(layout, list):
        for i, c in enumerate(layout):
            _visit_layout(c, join(path, i), fn)
    elif isinstance(layout, dict) and EMPTY not in layout:
        for k, c in layout.items():
            _visit_layout(c, join(path, k), fn)


def build(layout: Any, leaf: Callable[[str, dict[str, Any]], Any], *, ordered: bool,
          path: str = "") -> Any:
    """A tree of plain containers from a layout; `leaf(path, marker)` makes each leaf.

    `ordered=False` gives lists and dicts (what orbax stores for tuples and NamedTuples),
    `ordered=True` lists only, in the original flattening order (what an Equinox leaf file needs).
    """
    if isinstance(layout, dict) and LEAF in layout:
        return leaf(path, layout)
    if isinstance(layout, dict) and EMPTY in layout:
        return {"dict": {}, "list": []}.get(layout[EMPTY]) if not ordered else None
    if isinstance(layout, list):
        return [build(c, leaf, ordered=ordered, path=join(path, i)) for i, c in enumerate(layout)]
    if isinstance(layout, dict):
        items = [(k, build(c, leaf, ordered=ordered, path=join(path, k)))
                 for k, c in layout.items()]
        return [v for _, v in items] if ordered else dict(items)
    raise ConversionError(f"invalid optimizer layout node at {path or '<root>'!r}: {layout!r}")


def walk(layout: Any, tree: Any, *, ordered: bool, path: str = ""
         ) -> list[tuple[str, dict[str, Any], Any]]:
    """(path, marker, native value) of every layout leaf, read from a container tree such as
    `build` makes or orbax restores (lists for sequences, dicts keyed by name)."""
    if isinstance(layout, dict) and LEAF in layout:
        return [(path, layout, tree)]
    if isinstance(layout, dict) and EMPTY in layout:
        return []
    if isinstance(layout, list):
        keys: list[Any] = list(range(len(layout)))
        children = layout
    else:
        keys, children = list(layout), list(layout.values())
    by_position = ordered and isinstance(layout, dict)
    out = []
    for i, (k, c) in enumerate(zip(keys, children, strict=True)):
        try:
            node = tree[i] if by_position else tree[k]
        except (KeyError, IndexError, TypeError) as e:
            raise ConversionError(
                f"optimizer state has no entry {join(path, k)!r} required by its layout") from e
        out += walk(c, node, ordered=ordered, path=join(path, k))
    return out


# --------------------------------------------------------------------------- native <-> canonical
def _mirror_test(params: Any) -> Callable[[Any], bool]:
    struct = jax.tree.structure(params)
    n = struct.num_leaves
    return lambda x: (not is_array_leaf(x) and x is not None
                      and len(jax.tree.leaves(x)) == n and jax.tree.structure(x) == struct)


def to_canonical_opt(opt_state: Any, model: Any, impl: str) -> CanonicalOptState:
    """The canonical form of a native optax state built for `model`'s parameters."""
    api = interface(impl)
    static, params, bstate = api.split(model)
    config = config_of(model, impl)
    keys = param_keys(config)
    arrays: dict[str, np.ndarray] = {}
    problems: list[str] = []

    def on_mirror(path: str, mirror: Any) -> None:
        canon = to_canonical(api.merge(static, mirror, bstate), impl)
        for k in keys:
            arrays[f"{path}/{k}"] = np.asarray(canon[k])

    def on_array(path: str, a: Any) -> None:
        a = np.asarray(a)
        if a.ndim:
            problems.append(
                f"{path or '<root>'}: array of shape {a.shape} is neither a scalar nor part of a "
                "subtree that mirrors the parameters")
        arrays[path] = a

    layout = describe(opt_state, _mirror_test(params), on_mirror, on_array)
    if problems:
        raise ConversionError(
            "cannot convert this optimizer state (only parameter-shaped subtrees and scalars "
            "have a layout):\n  - " + "\n  - ".join(problems))
    return CanonicalOptState(layout, arrays)


def validate_opt(opt: CanonicalOptState, config: Config, prefix: str = "optimizer/") -> None:
    """Every optimizer array present, with the shapes of the parameters; nothing extra."""
    spec = _spec_shapes(config)
    keys = param_keys(config)
    problems: list[str] = []
    expected: set[str] = set()
    for path, marker in opt.entries():
        if marker[LEAF] == "params":
            dtypes = set()
            for k in keys:
                name = f"{path}/{k}"
                expected.add(name)
                if name not in opt.arrays:
                    problems.append(f"missing key {prefix + name!r} (expected shape "
                                    f"{spec[k]})")
                    continue
                got = opt.arrays[name]
                if tuple(got.shape) != spec[k]:
                    problems.append(f"{prefix + name!r}: expected shape {spec[k]}, "
                                    f"found {tuple(got.shape)}")
                dtypes.add(np.dtype(got.dtype))
                if not jnp.issubdtype(got.dtype, jnp.floating):
                    problems.append(f"{prefix + name!r}: expected a floating dtype, found "
                                    f"{got.dtype}")
            if len(dtypes) > 1:
                problems.append(f"{prefix + path!r}: mixed dtypes {sorted(map(str, dtypes))}")
        elif marker[LEAF] == "array":
            expected.add(path)
            if path not in opt.arrays:
                problems.append(f"missing key {prefix + path!r} (expected shape "
                                f"{tuple(marker['shape'])})")
                continue
            got = opt.arrays[path]
            want = (tuple(marker["shape"]), np.dtype(marker["dtype"]))
            if (tuple(got.shape), np.dtype(got.dtype)) != want:
                problems.append(f"{prefix + path!r}: expected shape {want[0]} dtype {want[1]}, "
                                f"found {tuple(got.shape)} {got.dtype}")
        else:
            problems.append(f"{prefix + path!r}: unknown leaf kind {marker[LEAF]!r}")
    problems += [f"unexpected key {prefix + k!r} (shape {tuple(np.shape(v))})"
                 for k, v in opt.arrays.items() if k not in expected]
    if problems:
        raise ConversionError(f"optimizer state does not fit {config.arch} "
                              f"{config.to_json()}: {len(problems)} problem(s):\n  - "
                              + "\n  - ".join(sorted(problems)))


def mirror_to_native(opt: CanonicalOptState, path: str, state: Mapping[str, Any],
                     config: Config, impl: str) -> Any:
    """The native parameter-shaped tree of the mirror at `path` (e.g. Adam's mu)."""
    keys = param_keys(config)
    values = {k: opt.arrays[f"{path}/{k}"] for k in keys}
    dt = np.dtype(next(iter(values.values())).dtype) if values else np.dtype("float32")
    full = {k: (np.asarray(v).astype(dt) if jnp.issubdtype(np.asarray(v).dtype, jnp.floating)
                else v) for k, v in state.items() if k not in values}
    full.update(values)
    return interface(impl).split(from_canonical(full, config, impl))[1]


def to_native_opt(opt: CanonicalOptState, state: Mapping[str, Any], config: Config, impl: str,
                  *, ordered: bool = False) -> Any:
    """A native optimizer state as plain containers (see `build`), without an optimizer."""

    def leaf(path: str, marker: dict[str, Any]) -> Any:
        if marker[LEAF] == "params":
            return mirror_to_native(opt, path, state, config, impl)
        return jnp.asarray(opt.arrays[path])

    return build(opt.layout, leaf, ordered=ordered)


def opt_state_like(opt: CanonicalOptState, state: Mapping[str, Any], config: Config,
                   impl: str, template: Any) -> Any:
    """The optimizer state in the exact structure of `template` (e.g. ``tx.init(params)``,
    concrete or abstract), filled from the canonical arrays."""
    params = interface(impl).split(from_canonical(dict(state), config, impl))[1]
    is_mirror = _mirror_test(params)
    want = describe(template, is_mirror)
    if want != opt.layout:
        raise ConversionError(
            "the optimizer's state layout differs from the checkpoint's:\n"
            f"  checkpoint: {_short(opt.layout)}\n  optimizer:  {_short(want)}")
    flat, treedef = jax.tree_util.tree_flatten_with_path(template, is_leaf=is_mirror)
    leaves = []
    for keypath, leaf in flat:
        path = "/".join(_key_name(k) for k in keypath)
        if is_mirror(leaf):
            leaves.append(mirror_to_native(opt, path, state, config, impl))
        else:
            leaves.append(jnp.asarray(opt.arrays[path], dtype=getattr(leaf, "dtype", None)))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _short(layout: Any) -> str:
    import json

    text = json.dumps(layout)
    return text if len(text) < 300 else text[:300] + "..."


def canonical_from_native(layout: Any, tree: Any, model: Any, impl: str, *, ordered: bool
                          ) -> CanonicalOptState:
    """The canonical form of an optimizer state stored as plain containers following `layout`
    (what `to_native_opt` builds, what orbax restores, what an Equinox leaf file holds)."""
    api = interface(impl)
    static, _, bstate = api.split(model)
    keys = param_keys(config_of(model, impl))
    arrays: dict[str, np.ndarray] = {}
    for path, marker, value in walk(layout, tree, ordered=ordered):
        if marker[LEAF] == "params":
            canon = to_canonical(api.merge(static, value, bstate), impl)
            arrays.update({f"{path}/{k}": np.asarray(canon[k]) for k in keys})
        else:
            arrays[path] = np.asarray(value)
    return CanonicalOptState(layout, arrays)


def abstract_params(skeleton: Any, impl: str) -> Any:
    """The parameter tree (as `zoo.interface(impl).split` gives it) of an abstract skeleton:
    the interface counts abstract floating arrays as parameters too."""
    return interface(impl).split(skeleton)[1]
