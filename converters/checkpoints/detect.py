"""Format detection: what a checkpoint path holds (`detect`), without reading its arrays."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

import converters.checkpoints.formats  # noqa: F401  (registers the formats)
from converters.checkpoints.checkpoint import Detection
from converters.checkpoints.format import Probe, registered
from converters.checkpoints.io import CheckpointError

_ONCE: ContextVar[dict[tuple, Detection] | None] = ContextVar("detections", default=None)


@contextlib.contextmanager
def detecting_once() -> Iterator[None]:
    """Within the block, a path is detected once while it is unchanged (same file, size and
    modification time): a command that looks at its source and then reads it checks the
    sidecar's digest (a full pass over the data) once."""
    token = _ONCE.set({})
    try:
        yield
    finally:
        _ONCE.reset(token)


def detect(path: str | os.PathLike) -> Detection:
    """The format of a checkpoint path, and why; CheckpointError if it is none we know (see
    `detect_path`; reused inside `detecting_once`)."""
    seen = _ONCE.get()
    if seen is None:
        return detect_path(path)
    try:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        return detect_path(path)
    if key not in seen:
        seen[key] = detect_path(path)
    return seen[key]


def detect_path(path: str | os.PathLike) -> Detection:
    """The format of a checkpoint path, and why; CheckpointError if it is none we know.

    By content, never by name: each registered format looks at the path in turn, those whose
    evidence is a validated structure (a safetensors header) before those that read a magic
    number (zip, ``.npy``, pickle); a directory is asked only of the directory formats. A file
    named like a format (its suffix) that no format claims is reported as that format damaged.
    """
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        raise CheckpointError(f"{path}: no such file or directory")
    is_dir = path.is_dir()
    if not is_dir and not path.is_file():
        raise CheckpointError(f"{path}: not a regular file or directory")
    probe = Probe(path)
    if not is_dir and probe.size == 0:
        raise CheckpointError(f"{path}: empty file (0 bytes), not a checkpoint")
    formats = registered()
    for fmt in formats:
        if fmt.directory == is_dir:
            det = fmt.detect(probe)
            if det is not None:
                return det
    reasons = list(dict.fromkeys(f.rejection(probe) for f in formats if f.directory == is_dir))
    if is_dir:
        raise CheckpointError("; ".join(reasons))
    named = [f for f in formats if path.suffix.lower() in f.suffixes]
    if named:
        raise CheckpointError(named[0].damaged(probe))
    others = dict.fromkeys(f.rejection(probe) for f in formats if f.directory)
    raise CheckpointError(f"cannot detect the format of {path}: "
                          + ", ".join([*reasons, *others]) + f" (first bytes {probe.head[:8]!r})")
