"""Orbax checkpoint directories of Flax Linen variables or NNX states: reader and writer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from converters.checkpoints.base import (
    Checkpoint,
    Detection,
    _dtype_of,
    _first_line,
    _meta,
    _most_common,
    _np_state,
    _resolve_config,
    _restore_nbt,
    _Task,
    _with_dtype,
    _write_json,
)
from converters.checkpoints.detect import _orbax_tree
from converters.checkpoints.io import DIR_METADATA, CheckpointError, ProgressFn
from converters.core import ConversionError, KeyMismatchError, to_canonical
from converters.optim import abstract_params, build, canonical_from_native
from zoo.configs import Config
from zoo.registry import skeleton


def _flat_abstract(tree: Any) -> dict[str, Any]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    name = lambda p: ".".join(str(getattr(k, a)) for k in p for a in ("name", "key", "idx")
                              if hasattr(k, a))
    return {name(p): x for p, x in flat}


def _orbax_problems(stored: dict[str, Any], target: dict[str, Any]) -> list[str]:
    problems = [f"missing key {k!r} (expected shape {tuple(np.shape(v))})"
                for k, v in target.items() if k not in stored]
    problems += [f"unexpected key {k!r} (shape {tuple(getattr(v, 'shape', ()) or ())})"
                 for k, v in stored.items() if k not in target]
    for k in stored.keys() & target.keys():
        got, want = stored[k], target[k]
        if not isinstance(want, jax.ShapeDtypeStruct):
            continue  # a Python scalar such as the step
        gshape = tuple(getattr(got, "shape", ()) or ())
        gdtype = getattr(got, "dtype", None)
        if gshape != tuple(want.shape):
            problems.append(f"{k!r}: expected shape {tuple(want.shape)}, found {gshape}")
        elif gdtype is not None and np.dtype(gdtype) != np.dtype(want.dtype):
            problems.append(f"{k!r}: expected dtype {np.dtype(want.dtype)}, found {gdtype}")
    return sorted(problems)


def _orbax_target(fmt: str, config: Config, dtype: Any, meta: dict[str, Any] | None,
                  pure_nnx: bool = False) -> tuple[Any, Any]:
    """(skeleton, abstract restore target) of a Linen / NNX checkpoint we would write."""
    skel = _with_dtype(skeleton(config, fmt, dtype), dtype)
    if fmt == "linen":
        model_target: Any = dict(skel[1])
    else:
        from flax import nnx

        model_target = nnx.split(skel)[1]
        if pure_nnx:
            model_target = nnx.to_pure_dict(model_target)
    if not meta or meta.get("kind") != "training":
        return skel, model_target
    layout, step = meta.get("optimizer"), meta.get("step")
    target = dict(model_target) if fmt == "linen" else {"model": model_target}
    if layout is not None:
        mirror = abstract_params(skel, fmt)
        target["opt_state"] = build(
            layout, lambda p, m: mirror if m["__leaf__"] == "params" else
            jax.ShapeDtypeStruct(tuple(m["shape"]), jnp.dtype(m["dtype"])), ordered=False)
    if step is not None:
        target["step"] = 0
    return skel, target


def _read_orbax(path: Path, det: Detection, given: Config | None,
                progress: ProgressFn | None) -> Checkpoint:
    import orbax.checkpoint as ocp

    fmt, meta = det.fmt, det.meta
    config = _resolve_config(path, meta, given)
    stored = _orbax_tree(path)
    pure = fmt == "nnx" and not any(k.endswith(".value") for k in stored)
    dtype = _dtype_of(meta)
    if dtype is None:
        skel, target = _orbax_target(fmt, config, "float32", meta, pure)
        floats = [np.dtype(stored[k].dtype) for k, v in _flat_abstract(target).items()
                  if k in stored and isinstance(v, jax.ShapeDtypeStruct)
                  and jnp.issubdtype(v.dtype, jnp.floating) and getattr(stored[k], "dtype", None)
                  is not None and jnp.issubdtype(np.dtype(stored[k].dtype), jnp.floating)]
        dtype = _most_common(floats)
    skel, target = _orbax_target(fmt, config, dtype, meta, pure)
    problems = _orbax_problems(stored, _flat_abstract(target))
    if problems:
        missing = sum(p.startswith("missing") for p in problems)
        hint = ("\n(most keys do not match: is this a "
                f"{'Linen' if fmt == 'linen' else 'NNX'} {config.arch} checkpoint with this "
                "config?)" if missing > len(_flat_abstract(target)) // 2 else "")
        names_differ = any(p.startswith(("missing", "unexpected")) for p in problems)
        raise (KeyMismatchError if names_differ else ConversionError)(
            f"{path} does not fit {config.arch} {config.to_json()}: "
            f"{len(problems)} problem(s):\n  - " + "\n  - ".join(problems[:50]) + hint)
    task = _Task(progress, "reading", 1)
    try:
        with ocp.StandardCheckpointer() as ckptr:
            restored = ckptr.restore(path.absolute(), target)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot restore the orbax checkpoint "
                              f"({type(e).__name__}: {_first_line(e)}): damaged?") from e
    task.advance()
    training = bool(meta and meta.get("kind") == "training")
    if fmt == "linen":
        model_part = {k: v for k, v in restored.items() if k not in ("opt_state", "step")}
        model: Any = (skel[0], model_part)
    else:
        from flax import nnx

        model_part = restored["model"] if training else restored
        graphdef, abstract_state = nnx.split(skel)
        if pure:
            nnx.replace_by_pure_dict(abstract_state, model_part)
            model_part = abstract_state
        model = nnx.merge(graphdef, model_part)
    state = _np_state(to_canonical(model, fmt))
    _restore_nbt(state, meta)
    opt = step = None
    if training:
        if meta.get("optimizer") is not None:
            opt = canonical_from_native(meta["optimizer"], restored["opt_state"], model, fmt,
                                        ordered=False)
        step = int(restored["step"]) if "step" in restored else None
    return Checkpoint(config, state, opt, step)


def _write_orbax(ck: Checkpoint, fmt: str, dtype: np.dtype, native: tuple[Any, Any], tmp: Path,
                 dst: Path) -> None:
    model, opt = native
    if fmt == "linen":
        tree: dict[str, Any] = dict(model[1])
    else:
        from flax import nnx

        tree = nnx.state(model)
        if ck.training:
            tree = {"model": tree}
    if ck.training:
        if opt is not None:
            tree["opt_state"] = opt
        if ck.step is not None:
            tree["step"] = int(ck.step)
    save_orbax_tree(tree, tmp)
    _write_json(tmp / DIR_METADATA, _meta(ck, fmt, dtype))


def save_orbax_tree(tree: Any, path: Path) -> None:
    """An orbax checkpoint directory of `tree` (Linen variables, an NNX state) at `path`."""
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path.absolute(), tree)
        ckptr.wait_until_finished()
