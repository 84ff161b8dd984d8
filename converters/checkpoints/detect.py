"""Format detection: what a checkpoint path holds (`detect`), without reading its arrays."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from converters.checkpoints.base import FORMAT_VERSION, Detection, _first_line
from converters.checkpoints.io import (
    DIR_METADATA,
    NPY_MAGIC,
    CheckpointError,
    read_json_meta,
    sidecar_path,
)
from converters.checkpoints.metadata import check_meta, loads_json

ORBAX_MARKERS = ("_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt", "checkpoint")


_ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1,
                "F8_E5M2": 1}


def _safetensors_header(path: Path, size: int) -> tuple[dict[str, Any] | None, str]:
    """The validated safetensors header, or None and why this is not a safetensors file: the
    length fits the file, the header is a JSON object, every tensor's offsets lie inside the
    data and match its shape and dtype (all in Python integers: nothing overflows)."""
    if size < 10:
        return None, f"only {size} bytes"
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n < 2 or n > size - 8:
            return None, f"header length {n} does not fit the file size {size}"
        if n > 100 * 2**20:
            return None, f"header length {n} exceeds 100 MiB"
        raw = f.read(n)
    if not raw.startswith(b"{"):
        return None, "no JSON header"
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        return None, f"corrupted JSON header ({type(e).__name__})"
    if not isinstance(header, dict):
        return None, "header is not a JSON object"
    data = size - 8 - n
    for name, t in header.items():
        if name == "__metadata__":
            continue
        ok = (isinstance(t, dict) and t.get("dtype") in _ST_ITEMSIZE
              and isinstance(t.get("shape"), list) and isinstance(t.get("data_offsets"), list)
              and all(isinstance(d, int) and d >= 0 for d in t["shape"])
              and len(t["data_offsets"]) == 2
              and all(isinstance(o, int) for o in t["data_offsets"]))
        if not ok:
            return None, f"tensor {name!r}: malformed header entry"
        begin, end = t["data_offsets"]
        if not 0 <= begin <= end <= data:
            return None, f"tensor {name!r}: offsets {begin}..{end} outside the {data} data bytes"
        if end - begin != math.prod(t["shape"]) * _ST_ITEMSIZE[t["dtype"]]:
            return None, f"tensor {name!r}: offsets do not match its shape and dtype"
    return header, ""


def _safetensors_meta(path: Path, header: dict[str, Any]) -> dict[str, Any] | None:
    """Our metadata from a safetensors header (None if the file is not ours), type-checked."""
    raw = header.get("__metadata__")
    if raw is None:
        return None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise CheckpointError(f"{path}: safetensors __metadata__ must be an object of strings, "
                              f"found {str(raw)[:80]!r}")
    if "arch" not in raw and "zoo_format" not in raw:
        return None
    meta: dict[str, Any] = {"format_version": raw.get("format_version", str(FORMAT_VERSION)),
                            "format": raw.get("zoo_format"), "dtype": raw.get("dtype"),
                            "kind": raw.get("kind", "model")}
    meta["config"] = (loads_json(raw["config"], path, "metadata field 'config'")
                      if "config" in raw else {"arch": raw["arch"]})
    meta["optimizer"] = (loads_json(raw["optimizer"], path, "metadata field 'optimizer'")
                         if raw.get("optimizer") else None)
    step = raw.get("step")
    if step in (None, "", "null"):
        meta["step"] = None
    elif step.isdigit() and len(step) < 20:
        meta["step"] = int(step)
    else:
        raise CheckpointError(f"{path}: metadata field 'step': expected a non-negative "
                              f"integer, found {step[:40]!r}")
    return check_meta(meta, path)


def _orbax_tree(path: Path) -> dict[str, Any]:
    """The stored tree of an orbax checkpoint directory: {dotted name: metadata}."""
    import orbax.checkpoint as ocp

    try:
        with ocp.StandardCheckpointer() as ckptr:
            md = ckptr.metadata(path.absolute())
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the orbax checkpoint metadata "
                              f"({type(e).__name__}: {_first_line(e)}): damaged?") from e
    tree = getattr(md, "item_metadata", md)
    tree = getattr(tree, "tree", tree)
    flat: dict[str, Any] = {}

    def visit(node: Any, name: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                visit(v, f"{name}.{k}" if name else str(k))
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                visit(v, f"{name}.{i}" if name else str(i))
        elif node is not None:
            flat[name] = node

    visit(tree, "")
    if not flat:
        raise CheckpointError(f"{path}: the orbax checkpoint holds no arrays")
    return flat


def detect(path: str | os.PathLike) -> Detection:
    """The format of a checkpoint path, and why; CheckpointError if it is none we know.

    By content, in a safe order: a directory is orbax (by its metadata); a file is safetensors
    when its header validates, else torch.save by the zip magic, Equinox by the .npy magic (its
    sidecar gives the architecture) and, last, a legacy torch.save pickle by its first byte.
    """
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        raise CheckpointError(f"{path}: no such file or directory")
    if path.is_dir():
        return _detect_dir(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: not a regular file or directory")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path}: empty file (0 bytes), not a checkpoint")
    header, why_not = _safetensors_header(path, size)
    if header is not None:
        meta = _safetensors_meta(path, header)
        if meta is not None and meta.get("format") == "canonical":
            return Detection("canonical", "safetensors with zoo metadata format 'canonical'",
                             meta, "safetensors")
        return Detection("torch", "safetensors without canonical metadata: a PyTorch state_dict",
                         meta, "safetensors")
    with open(path, "rb") as f:
        head = f.read(16)
    side, note = _sidecar(path, size)
    if head.startswith(b"PK\x03\x04"):
        return Detection("torch", "zip archive: a torch.save file", side, "pt", note)
    if head.startswith(NPY_MAGIC):
        why = "starts with the .npy magic: an Equinox tree_serialise_leaves file"
        return Detection("eqx", why + (f", sidecar {sidecar_path(path).name}" if side else ""),
                         side, "", note)
    if head[:1] == b"\x80":
        return Detection("torch", "pickle stream: a legacy torch.save file", side, "pt", note)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        raise CheckpointError(f"{path}: not a valid safetensors file ({why_not}): truncated or "
                              "corrupted")
    if suffix in (".pt", ".pth", ".bin"):
        raise CheckpointError(f"{path}: not a torch.save file (neither a zip archive nor a "
                              "pickle stream): corrupted")
    if suffix == ".eqx":
        raise CheckpointError(f"{path}: not an Equinox leaf file (no .npy magic): corrupted")
    raise CheckpointError(
        f"cannot detect the format of {path}: not safetensors ({why_not}), not a torch.save zip "
        f"or pickle, not an Equinox .npy stream, not an orbax directory (first bytes {head[:8]!r})")


def _sidecar(path: Path, size: int) -> tuple[dict[str, Any] | None, str]:
    """The sidecar's metadata, or None with a note when it describes other data (stale)."""
    from converters.checkpoints.destination import digest, pending_sidecar

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


def _detect_dir(path: Path) -> Detection:
    meta = read_json_meta(path / DIR_METADATA)
    if meta is not None:
        check_meta(meta, path / DIR_METADATA)
    if not any((path / m).exists() for m in ORBAX_MARKERS):
        inner = sorted(str(p.parent.relative_to(path)) for m in ORBAX_MARKERS
                       for p in path.glob(f"*/{m}"))
        hint = (f"; it contains checkpoints, e.g. {path / inner[0]}: pass one of them"
                if inner else "")
        raise CheckpointError(
            f"{path} is a directory but not an orbax checkpoint (none of "
            f"{', '.join(ORBAX_MARKERS)} in it){hint}")
    if meta is not None and meta.get("format") in ("linen", "nnx"):
        return Detection(meta["format"], f"orbax checkpoint directory with {DIR_METADATA} "
                         f"saying format {meta['format']!r}", meta)
    names = list(_orbax_tree(path))
    top = sorted({n.split(".")[0] for n in names})
    if "params" in top:
        return Detection("linen", "orbax checkpoint directory with a top-level 'params' "
                         "collection: Linen variables", meta)
    if any(n.endswith(".value") for n in names):
        return Detection("nnx", "orbax checkpoint directory whose leaves are NNX Variable "
                         "'.value' entries: an nnx.state", meta)
    return Detection("nnx", f"orbax checkpoint directory without a 'params' collection (top-level "
                     f"keys {top[:6]}): taken as an NNX state", meta)
