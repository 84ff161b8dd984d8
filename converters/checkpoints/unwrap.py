"""Find the model weights inside a wrapped checkpoint, by content, not by a list of keys.

Training code saves more than a state_dict: ``{"model": sd, "optimizer": ..., "epoch": ...}``
(torchvision's reference scripts), timm's `CheckpointSaver` (``state_dict``,
``state_dict_ema``, ``optimizer``, ``args``, ...), Lightning's ``{"state_dict": {"model.x":
...}}``. Every mapping of names to arrays in the tree is a candidate; the weights are the
largest one (most values). Candidates holding the same names and shapes (after the wrapper
prefixes ``module.``, ``_orig_mod.``) are copies of the model: live and EMA weights, told apart
by the path that holds them (``ema`` in it). Everything else is left out, and said so in one
line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from converters.checkpoints.io import CheckpointError, UsageError

WEIGHTS = ("main", "ema")  # what --weights chooses between
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DistributedDataParallel, torch.compile
_EMA = re.compile(r"(^|[^a-z])ema([^a-z]|$)", re.IGNORECASE)


@dataclass(frozen=True)
class Unwrapped:
    """The weights found: `state` (names -> arrays), where they were (`path`, "" at the top),
    and one line saying what was chosen and left out ("" when the file held only weights)."""

    state: dict[str, Any]
    path: str
    note: str


def unwrap(obj: Any, is_array: Callable[[Any], bool], where: str,
           weights: str | None = None) -> Unwrapped:
    """The model weights inside `obj` (see the module doc); `weights` chooses "main" (live) or
    "ema" weights where both exist. CheckpointError when `obj` holds no mapping of arrays."""
    if weights is not None and weights not in WEIGHTS:
        raise UsageError(f"--weights {weights!r}: expected one of {list(WEIGHTS)}")
    found = _candidates(obj, is_array, "")
    if not found:
        raise CheckpointError(f"{where}: holds a {type(obj).__name__} with no mapping of names "
                              "to tensors: not a state_dict")
    stripped = {path: _strip_wrappers(tree) for path, tree in found.items()}
    best = max(stripped, key=lambda p: (len(stripped[p][0]), -p.count("/")))
    signature = _signature(stripped[best][0])
    copies = [p for p in found if _signature(stripped[p][0]) == signature]
    ema = [p for p in copies if _EMA.search(p)]
    main = [p for p in copies if p not in ema]
    chosen, said = _choose(main, ema, weights, where)
    state, dropped = stripped[chosen]
    left = [_describe(obj, p) for p in _left_out(obj, chosen)]
    left += [f"{chosen}/{k}" if chosen else k for k in dropped]
    parts = [said] if said else []
    if left:
        parts.append("left out: " + ", ".join(left))
    note = (f"weights taken from {chosen!r}" if chosen else "weights at the top level")
    return Unwrapped(state, chosen, "; ".join([note, *parts]) if parts or chosen else "")


def _candidates(obj: Any, is_array: Callable[[Any], bool], path: str) -> dict[str, dict]:
    """Every mapping (at any depth under string keys) whose values are all arrays."""
    if not isinstance(obj, Mapping) or not obj:
        return {}
    if all(isinstance(k, str) for k in obj) and all(is_array(v) for v in obj.values()):
        return {path: dict(obj)}
    out: dict[str, dict] = {}
    for k, v in obj.items():
        if isinstance(k, str):
            out.update(_candidates(v, is_array, f"{path}/{k}" if path else k))
    return out


def _strip_wrappers(tree: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`tree` without the wrapper prefixes every key shares (a few bare scalars such as
    torchvision EMA's ``n_averaged`` aside: those are returned as dropped)."""
    dropped: list[str] = []
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            inside = [k for k in tree if k.startswith(prefix)]
            rest = [k for k in tree if not k.startswith(prefix)]
            if inside and all(getattr(tree[k], "ndim", 1) == 0 for k in rest):
                dropped += rest
                tree = {k[len(prefix):]: tree[k] for k in inside}
                changed = True
    return tree, dropped


def _signature(tree: dict[str, Any]) -> frozenset:
    return frozenset((k, tuple(getattr(v, "shape", ()))) for k, v in tree.items())


def _choose(main: list[str], ema: list[str], weights: str | None, where: str
            ) -> tuple[str, str]:
    """(the chosen path, what to say about the choice)."""
    pool = {"main": main, "ema": ema}
    if weights is not None and not pool[weights]:
        other = "ema" if weights == "main" else "main"
        raise UsageError(f"--weights {weights}: {where} holds no {_KIND[weights]} weights, only "
                         f"{_KIND[other]} ones at {pool[other]}")
    kind = weights or ("main" if main else "ema")
    if len(pool[kind]) > 1:
        raise CheckpointError(f"{where}: {len(pool[kind])} copies of the model's weights at "
                              f"{pool[kind]}, and nothing tells which is the model")
    said = ""
    if main and ema and weights is None:
        said = (f"both live and EMA weights found: used the live ones (--weights ema takes "
                f"{ema[0]!r})")
    return pool[kind][0], said


_KIND = {"main": "live (non-EMA)", "ema": "EMA"}


def _left_out(obj: Any, chosen: str) -> list[str]:
    """The paths beside the chosen one, at each level down to it."""
    out, node, here = [], obj, ""
    for part in chosen.split("/") if chosen else []:
        out += [f"{here}/{k}" if here else str(k) for k in node if k != part]
        node, here = node[part], f"{here}/{part}" if here else part
    return out


def _describe(obj: Any, path: str) -> str:
    """A left-out entry's path and, for the usual ones, what it is."""
    node = obj
    for part in path.split("/"):
        node = node[part] if isinstance(node, Mapping) and part in node else None
    kind = type(node).__name__
    if _EMA.search(path):
        kind = "EMA weights"
    elif isinstance(node, Mapping) and {"state", "param_groups"} <= set(node):
        kind = "optimizer state"
    elif isinstance(node, int | float | str):
        kind = repr(node) if len(repr(node)) <= 12 else type(node).__name__
    return f"{path} ({kind})"


def unwrap_variables(tree: Any, where: str, weights: str | None = None) -> Unwrapped:
    """The model variables of a Flax tree: the ``params`` collection and the collections beside
    it whose modules are modules of ``params`` (``batch_stats``); a `TrainState`'s
    ``opt_state``, ``step`` and anything else beside them are left out, said in one line.
    An EMA copy beside ``params`` (a mapping shaped like it with ``ema`` in its name, such as
    ``ema_params``) is the other set of weights: `weights` ("main" or "ema") chooses, as for
    torch checkpoints; the chosen set is returned as ``params``.
    A tree without ``params`` (an NNX state, Linen ``params`` alone) is returned whole."""
    if weights is not None and weights not in WEIGHTS:
        raise UsageError(f"--weights {weights!r}: expected one of {list(WEIGHTS)}")
    found = _with_params(tree, "")
    if found is None:
        if weights is not None:
            raise UsageError(f"--weights {weights}: {where} holds one set of weights")
        return Unwrapped(dict(tree), "", "")
    path, node = found
    shape = _structure(node["params"])
    ema = [str(k) for k, v in node.items() if k != "params" and _EMA.search(str(k))
           and isinstance(v, Mapping) and _structure(v) == shape]
    chosen, said = _choose(["params"], ema, weights, where)
    modules = set(node["params"])
    kept = {"params": node[chosen]}
    kept.update({k: v for k, v in node.items() if k not in ("params", *ema) and (
        isinstance(v, Mapping) and v and set(v) <= modules and _all_arrays(v))})
    inside = (f"{path}/{{}}" if path else "{}").format
    left = [_describe_jax(node, k, inside(k)) for k in node
            if k not in kept and k not in ("params", *ema)]
    left += [f"{inside(k)} ({'live weights' if k == 'params' else 'EMA weights'})"
             for k in ("params", *ema) if k != chosen]
    left += [_describe(tree, p) for p in _left_out(tree, path)]
    taken = f"variables {sorted(kept)}" + (f" taken from {path!r}" if path else "")
    if chosen != "params":
        taken += f", params from {inside(chosen)!r}"
    parts = [taken, *([said] if said else []), *([f"left out: {', '.join(left)}"] if left
                                                  else [])]
    return Unwrapped(kept, path, "; ".join(parts) if left or said or chosen != "params" else "")


def _with_params(tree: Any, path: str) -> tuple[str, Mapping] | None:
    """The shallowest mapping holding a ``params`` mapping, and its path."""
    if not isinstance(tree, Mapping):
        return None
    if isinstance(tree.get("params"), Mapping):
        return path, tree
    for k, v in tree.items():
        hit = _with_params(v, f"{path}/{k}" if path else str(k))
        if hit is not None:
            return hit
    return None


def _all_arrays(tree: Any) -> bool:
    if isinstance(tree, Mapping):
        return all(_all_arrays(v) for v in tree.values())
    return hasattr(tree, "shape") and hasattr(tree, "dtype")


def _structure(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return tuple(sorted((str(k), _structure(v)) for k, v in tree.items()))
    return tuple(getattr(tree, "shape", ()))


def _describe_jax(node: Mapping, key: str, path: str) -> str:
    """A left-out entry beside ``params``: optimizer state when it holds trees shaped like
    the params (Adam's moments), else its value or type."""
    params, value = _structure(node["params"]), node[key]
    if isinstance(value, Mapping | list | tuple) and _holds(value, params):
        return f"{path} (optimizer state)"
    if hasattr(value, "shape") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, int | float):
        return f"{path} ({value!r})"
    return f"{path} ({type(value).__name__})"


def _holds(tree: Any, structure: Any) -> bool:
    if _structure(tree) == structure:
        return True
    items = tree.values() if isinstance(tree, Mapping) else tree if isinstance(
        tree, list | tuple) else ()
    return any(_holds(v, structure) for v in items)
