"""Equinox files (`eqx.tree_serialise_leaves` plus a JSON sidecar): reader and writer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from converters.checkpoints.base import (
    Checkpoint,
    Detection,
    _dtype_of,
    _first_line,
    _most_common,
    _np_state,
    _resolve_config,
    _restore_nbt,
    _Task,
    _with_dtype,
)
from converters.checkpoints.io import CheckpointError, ProgressFn, load_npy, scan_npy_stream
from converters.core import ConversionError, to_canonical
from converters.optim import abstract_params, build, canonical_from_native
from zoo.configs import Config
from zoo.registry import skeleton


def _eqx_leaves(like: Any) -> list[tuple[str, Any]]:
    """(name, leaf) of every leaf that `eqx.tree_serialise_leaves` writes, in file order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(like)
    return [(jax.tree_util.keystr(p), x) for p, x in flat
            if isinstance(x, jax.ShapeDtypeStruct | jax.Array | np.ndarray)
            or eqx.is_array_like(x)]


def _eqx_like(config: Config, dtype: Any, meta: dict[str, Any] | None) -> Any:
    model = _with_dtype(skeleton(config, "eqx", dtype), dtype)
    if not meta or meta.get("kind") != "training":
        return model
    layout, step = meta.get("optimizer"), meta.get("step")
    opt = None
    if layout is not None:
        mirror = abstract_params(model, "eqx")
        opt = build(layout, lambda p, m: mirror if m["__leaf__"] == "params" else
                    jax.ShapeDtypeStruct(tuple(m["shape"]), jnp.dtype(m["dtype"])), ordered=True)
    return (model, opt, None if step is None else 0)


def _eqx_problems(headers: list, leaves: list[tuple[str, Any]]) -> list[str]:
    problems = []
    if len(headers) != len(leaves):
        problems.append(f"the file holds {len(headers)} arrays, the model expects {len(leaves)}")
    for i, ((name, like), (shape, dtype)) in enumerate(zip(leaves, headers, strict=False)):
        if isinstance(like, jax.ShapeDtypeStruct | jax.Array | np.ndarray):
            want = (tuple(like.shape), np.dtype(like.dtype))
            if want != (shape, np.dtype(dtype)):
                problems.append(f"array #{i} {name}: expected shape {want[0]} {want[1]}, found "
                                f"{shape} {dtype}")
        elif shape != ():
            problems.append(f"array #{i} {name}: expected a scalar, found shape {shape}")
    return problems


def _read_eqx(path: Path, det: Detection, given: Config | None,
              progress: ProgressFn | None) -> Checkpoint:
    config = _resolve_config(path, det.meta, given)
    size = path.stat().st_size
    with open(path, "rb") as f:
        headers = scan_npy_stream(f, size, str(path))
    dtype = _dtype_of(det.meta)
    if dtype is None:  # no sidecar: the most common float dtype at floating-parameter positions
        leaves = _eqx_leaves(_eqx_like(config, "float32", det.meta))
        dtype = _most_common([
            np.dtype(d) for (_, like), (_, d) in zip(leaves, headers, strict=False)
            if isinstance(like, jax.ShapeDtypeStruct) and jnp.issubdtype(like.dtype, jnp.floating)
            and jnp.issubdtype(np.dtype(d), jnp.floating)])
    like = _eqx_like(config, dtype, det.meta)
    leaves = _eqx_leaves(like)
    problems = _eqx_problems(headers, leaves)
    if problems:
        hint = ("\n(is this an Equinox checkpoint of this architecture and config?)"
                if len(headers) != len(leaves) else "")
        raise ConversionError(f"{path} does not fit {config.arch} {config.to_json()}: "
                              f"{len(problems)} problem(s):\n  - " + "\n  - ".join(problems[:50])
                              + hint)
    task = _Task(progress, "reading", len(leaves))

    def spec(f: Any, x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct | jax.Array):
            a = jnp.asarray(load_npy(f))
        elif isinstance(x, np.ndarray):
            a = load_npy(f)
        elif eqx.is_array_like(x):
            a = type(x)(load_npy(f).item())
        else:
            return x
        task.advance()
        return a

    try:
        with open(path, "rb") as f:
            out = eqx.tree_deserialise_leaves(f, like, filter_spec=spec)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the Equinox file ({_first_line(e)}): "
                              "truncated or corrupted") from e
    if det.meta and det.meta.get("kind") == "training":
        model, opt_tree, step = out
    else:
        model, opt_tree, step = out, None, None
    state = _np_state(to_canonical(model, "eqx"))
    _restore_nbt(state, det.meta)
    opt = None
    if opt_tree is not None:
        opt = canonical_from_native(det.meta["optimizer"], opt_tree, model, "eqx", ordered=True)
    return Checkpoint(config, state, opt, None if step is None else int(step))


def _write_eqx(ck: Checkpoint, fmt: str, dtype: np.dtype, native: tuple[Any, Any], tmp: Path,
               dst: Path) -> None:
    model, opt = native
    save_eqx_tree((model, opt, ck.step) if ck.training else model, tmp)


def save_eqx_tree(tree: Any, path: Path) -> None:
    """`eqx.tree_serialise_leaves` of `tree` into `path`, whatever its suffix."""
    with open(path, "wb") as f:  # a handle: given a path, Equinox would force a .eqx suffix
        eqx.tree_serialise_leaves(f, tree)
