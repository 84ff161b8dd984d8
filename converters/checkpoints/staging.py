"""How a write is staged on disk: the names of temporaries and locks, and what an interrupted
write leaves behind (read by detection, managed by `converters.checkpoints.destination`)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from converters.checkpoints.io import CheckpointError, read_json_meta

TMP_PREFIX = ".zoo-tmp-"
LOCK_PREFIX = ".zoo-lock-"
DATA, SIDECAR, OLD, TARGET = "data", "sidecar.json", "old", "target"


def tag(dst: Path) -> str:
    """A short, filesystem-safe name for `dst` (temporary and lock names stay < 255 bytes)."""
    return hashlib.sha256(os.fsencode(dst.name)).hexdigest()[:16]


def digest(path: Path) -> dict[str, Any]:
    """Size and SHA-256 of a data file, as recorded in its sidecar."""
    with open(path, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    return {"size": path.stat().st_size, "sha256": sha}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pending_sidecar(path: Path) -> dict[str, Any] | None:
    """The sidecar an interrupted write of `path` left unpublished, if it describes exactly the
    data now at `path` (the crash fell between publishing the data and its sidecar)."""
    for side in path.parent.glob(f"{TMP_PREFIX}{tag(path)}-*/{SIDECAR}"):
        pid = side.parent.name.rpartition("-")[2]
        if not pid.isdigit() or pid_alive(int(pid)) or (side.parent / DATA).exists():
            continue
        try:
            meta = read_json_meta(side)
        except CheckpointError:
            continue
        if meta is not None and meta.get("data") == digest(path):
            return meta
    return None
