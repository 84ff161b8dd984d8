"""How a write is staged on disk: the names of temporaries and locks, and what an interrupted
write leaves behind (read by detection, managed by `converters.checkpoints.destination`)."""

from __future__ import annotations

import hashlib
import io
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


class HashingFile(io.RawIOBase):
    """A new file written front to back, its sidecar digest (`digest`) computed from the bytes
    as they pass: no second read of the file. Not seekable, so a writer that would seek back
    fails instead of leaving a wrong digest."""

    def __init__(self, path: Path):
        super().__init__()
        self._file = open(path, "wb")  # noqa: SIM115  (closed by `close`)
        self._sha = hashlib.sha256()
        self._size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = self._file.write(view)
        self._sha.update(view[:n])
        self._size += n
        return n

    def tell(self) -> int:
        return self._size

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._file.close()

    def digest(self) -> dict[str, Any]:
        """Size and SHA-256 of what was written, as `digest` of the finished file gives."""
        return {"size": self._size, "sha256": self._sha.hexdigest()}


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
