"""Format detection: what a checkpoint path holds (`detect`), without reading its arrays."""

from __future__ import annotations

import json
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

ORBAX_MARKERS = ("_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt", "checkpoint")


def _safetensors_meta(path: Path, size: int) -> tuple[dict[str, str] | None, str]:
    """The safetensors header metadata, or None and why this is not a safetensors file."""
    if size < 10:
        return None, f"only {size} bytes"
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            return None, f"header length {n} exceeds the file size {size}"
        header = f.read(n)
    if not header.startswith(b"{"):
        return None, "no JSON header"
    try:
        data = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return None, f"corrupted JSON header ({e})"
    if not isinstance(data, dict):
        return None, "header is not a JSON object"
    meta = data.get("__metadata__") or {}
    return {str(k): str(v) for k, v in meta.items()}, ""


def _normalise_safetensors_meta(raw: dict[str, str]) -> dict[str, Any] | None:
    if "arch" not in raw and "zoo_format" not in raw:
        return None
    meta: dict[str, Any] = {"format_version": raw.get("format_version", FORMAT_VERSION),
                            "format": raw.get("zoo_format"), "dtype": raw.get("dtype")}
    try:
        meta["config"] = json.loads(raw["config"]) if "config" in raw else {"arch": raw["arch"]}
        meta["optimizer"] = json.loads(raw["optimizer"]) if raw.get("optimizer") else None
        meta["step"] = int(raw["step"]) if raw.get("step") not in (None, "", "null") else None
    except (json.JSONDecodeError, ValueError) as e:
        raise CheckpointError(f"corrupted checkpoint metadata in the safetensors header: {e}"
                              ) from e
    meta["kind"] = raw.get("kind", "model")
    return meta


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
    """The format of a checkpoint path, and why; CheckpointError if it is none we know."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    if path.is_dir():
        return _detect_dir(path)
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path}: empty file (0 bytes), not a checkpoint")
    with open(path, "rb") as f:
        head = f.read(16)
    side = read_json_meta(sidecar_path(path))
    if head.startswith(NPY_MAGIC):
        why = "starts with the .npy magic: an Equinox tree_serialise_leaves file"
        return Detection("eqx", why + (f", sidecar {sidecar_path(path).name}" if side else ""),
                         side)
    if head.startswith(b"PK\x03\x04"):
        return Detection("torch", "zip archive: a torch.save file", side, "pt")
    if head[:1] == b"\x80":
        return Detection("torch", "pickle stream: a legacy torch.save file", side, "pt")
    raw, why_not = _safetensors_meta(path, size)
    if raw is not None:
        meta = _normalise_safetensors_meta(raw)
        if meta is not None and meta.get("format") == "canonical":
            return Detection("canonical", "safetensors with zoo metadata format 'canonical'",
                             meta, "safetensors")
        return Detection("torch", "safetensors without canonical metadata: a PyTorch state_dict",
                         meta, "safetensors")
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


def _detect_dir(path: Path) -> Detection:
    meta = read_json_meta(path / DIR_METADATA)
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
