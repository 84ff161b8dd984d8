"""Our checkpoint metadata (sidecars, ``zoo.json``, safetensors header): what is recorded, and
its schema, every field checked by type with errors naming the field and the file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from converters.checkpoints.checkpoint import FORMAT_VERSION, Checkpoint
from converters.checkpoints.io import (
    SIDECAR_MARKER,
    CheckpointError,
    read_json_meta,
    sidecar_path,
)
from converters.checkpoints.staging import digest, pending_sidecar
from converters.optim import EMPTY, LEAF

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
KINDS = ("model", "training")
INT64_MAX = 2**63 - 1


def _bad(path: Path, field: str, want: str, got: Any) -> CheckpointError:
    shown = repr(got)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return CheckpointError(f"{path}: metadata field {field!r}: expected {want}, found {shown}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_layout(layout: Any, path: Path, at: str = "optimizer") -> None:
    """An optimizer layout (see `converters.optim`): containers of leaf markers."""
    if isinstance(layout, list):
        for i, child in enumerate(layout):
            check_layout(child, path, f"{at}[{i}]")
        return
    if not isinstance(layout, dict):
        raise _bad(path, at, "a list or an object", layout)
    if LEAF in layout:
        kind = layout[LEAF]
        if kind == "params" and len(layout) == 1:
            return
        if kind != "array" or set(layout) != {LEAF, "shape", "dtype"}:
            raise _bad(path, at, "a leaf {'__leaf__': 'params'} or {'__leaf__': 'array', "
                       "'shape': [...], 'dtype': ...}", layout)
        shape = layout["shape"]
        if not isinstance(shape, list) or not all(_is_int(n) and 0 <= n <= INT64_MAX
                                                  for n in shape):
            raise _bad(path, f"{at}.shape", "a list of non-negative integers", shape)
        check_dtype_name(layout["dtype"], path, f"{at}.dtype", numeric=True)
        return
    if EMPTY in layout:
        if len(layout) != 1 or layout[EMPTY] not in ("dict", "list", "none"):
            raise _bad(path, at, "{'__empty__': 'dict' | 'list' | 'none'}", layout)
        return
    for k, child in layout.items():
        check_layout(child, path, f"{at}.{k}")


def check_dtype_name(name: Any, path: Path, field: str, *, numeric: bool = False) -> np.dtype:
    """A dtype name we store: floating (or, with `numeric`, any number type)."""
    import ml_dtypes

    if isinstance(name, str) and name in FLOAT_DTYPES:
        return np.dtype(getattr(ml_dtypes, name) if name == "bfloat16" else name)
    if numeric and isinstance(name, str):
        try:
            dt = np.dtype(name)
        except TypeError:
            dt = None
        if dt is not None and (np.issubdtype(dt, np.integer) or np.issubdtype(dt, np.bool_)
                               or np.issubdtype(dt, np.floating)):
            return dt
    raise _bad(path, field, f"one of {', '.join(FLOAT_DTYPES)}" + (" or an integer type"
               if numeric else ""), name)


def check_meta(meta: dict[str, Any], path: Path) -> dict[str, Any]:
    """`meta` itself after checking every field we read from it; CheckpointError otherwise."""
    if meta.get("dtype") is not None:
        check_dtype_name(meta["dtype"], path, "dtype")
    if meta.get("kind", "model") not in KINDS:
        raise _bad(path, "kind", "'model' or 'training'", meta.get("kind"))
    step = meta.get("step")
    if step is not None and not (_is_int(step) and 0 <= step <= INT64_MAX):
        raise _bad(path, "step", "a non-negative integer or null", step)
    if meta.get("config") is not None and not isinstance(meta["config"], dict):
        raise _bad(path, "config", "a JSON object", meta["config"])
    if meta.get("format") is not None and not isinstance(meta["format"], str):
        raise _bad(path, "format", "a format name", meta["format"])
    nbt = meta.get("num_batches_tracked")
    if nbt is not None:
        if not isinstance(nbt, dict):
            raise _bad(path, "num_batches_tracked", "an object {key: count}", nbt)
        for k, v in nbt.items():
            if not (_is_int(v) and 0 <= v <= INT64_MAX):
                raise _bad(path, f"num_batches_tracked.{k}", "an integer in [0, 2**63)", v)
    if meta.get("optimizer") is not None:
        try:
            check_layout(meta["optimizer"], path)
        except RecursionError as e:
            raise _bad(path, "optimizer", "a layout of sensible depth", "...") from e
    data = meta.get("data")
    if data is not None and not (isinstance(data, dict) and _is_int(data.get("size"))
                                 and isinstance(data.get("sha256"), str)):
        raise _bad(path, "data", "{'size': int, 'sha256': str}", data)
    return meta


def loads_json(text: str | bytes, path: Path, what: str) -> Any:
    """JSON from a file, with one clear error for every way it can be broken."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise CheckpointError(f"{path}: {what} is not valid JSON ({why})") from e


# --------------------------------------------------------------------------- what is recorded
def describe(ck: Checkpoint, fmt: str, *, with_batch_counts: bool) -> dict[str, Any]:
    """The metadata of `ck` written as format `fmt`; `with_batch_counts` for a format whose
    library keeps no BatchNorm batch counter (the counts are kept here instead)."""
    meta: dict[str, Any] = {
        SIDECAR_MARKER: FORMAT_VERSION, "format": fmt, "arch": ck.config.arch,
        "config": ck.config.to_dict(), "dtype": np.dtype(ck.dtype).name,
        "kind": "training" if ck.training else "model", "step": ck.step,
        "optimizer": ck.optimizer.layout if ck.optimizer is not None else None,
    }
    if with_batch_counts:
        meta["num_batches_tracked"] = num_batches_tracked(ck.state)
    return meta


def num_batches_tracked(state: Mapping[str, Any]) -> dict[str, int]:
    """The BatchNorm batch counters of a canonical state, {key: count}."""
    return {k: int(np.asarray(v)) for k, v in state.items() if k.endswith("num_batches_tracked")}


def restore_num_batches_tracked(state: dict[str, np.ndarray],
                                meta: dict[str, Any] | None) -> None:
    """Put the counters recorded in `meta` back into `state` (the library read lost them)."""
    for k, v in ((meta or {}).get("num_batches_tracked") or {}).items():
        if k in state:
            state[k] = np.asarray(int(v), np.int64)


def stored_dtype(meta: dict[str, Any] | None) -> np.dtype | None:
    """The floating dtype the metadata records, None without metadata."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)

    name = (meta or {}).get("dtype")
    return None if name is None else np.dtype(jnp.dtype(name))


def check_version(path: Path, meta: dict[str, Any] | None) -> None:
    """Refuse metadata of a newer format version than this code reads."""
    if meta is None:
        return
    version = meta.get(SIDECAR_MARKER, meta.get("format_version"))
    try:
        newer = int(version) > FORMAT_VERSION
    except (TypeError, ValueError):
        newer = True
    if newer:
        raise CheckpointError(f"{path}: checkpoint format version {version!r} is not supported "
                              f"(this version reads {FORMAT_VERSION})")


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")


def digest_checked(meta: dict[str, Any] | None) -> bool:
    """Whether detection found the data file to be the one its sidecar describes: `read_sidecar`
    keeps a sidecar recording a size and SHA-256 only when the file matches both."""
    return meta is not None and meta.get("data") is not None


def read_sidecar(path: Path, size: int) -> tuple[dict[str, Any] | None, str]:
    """The checked metadata of a single-file checkpoint's sidecar, or None with a note when the
    sidecar describes other data (stale); an unpublished sidecar of an interrupted write counts
    when it describes exactly this data."""
    side = sidecar_path(path)
    meta = read_json_meta(side)
    if meta is not None:
        check_meta(meta, side)
        data = meta.get("data")
        if data is None or (data.get("size") == size and data == digest(path)):
            return meta, ""
    pending = pending_sidecar(path)
    if pending is not None:
        check_meta(pending, side)
        return pending, (f"metadata taken from an interrupted write of {path.name} (its sidecar "
                         "was not published yet; the next write completes it)")
    if meta is None:
        return None, ""
    return None, (f"ignored {side.name}: it describes other data (stale, left by an "
                  "interrupted write)")
