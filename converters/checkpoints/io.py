"""Low-level file handling for checkpoints: errors, atomic output, sidecars, progress, npy scans.

Nothing here knows about models: `converters.checkpoints` builds on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

SIDECAR_SUFFIX = ".json"  # Equinox / PyTorch files: `model.eqx` + `model.eqx.json`
DIR_METADATA = "zoo.json"  # orbax directories: `<dir>/zoo.json`
SIDECAR_MARKER = "zoo_checkpoint"  # key that identifies our JSON (value: format version)

# A progress callback: (description, completed, total or None). Called with completed=0 first.
ProgressFn = Callable[[str, int, "int | None"], None]


class CheckpointError(ValueError):
    """A checkpoint file cannot be read, detected or written; the message says why."""


def no_progress(description: str, completed: int, total: int | None) -> None:
    del description, completed, total


# --------------------------------------------------------------------------- sidecars
def sidecar_path(path: str | os.PathLike) -> Path:
    """The JSON sidecar of a single-file checkpoint: `<path>.json`."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def read_json_meta(path: Path) -> dict[str, Any] | None:
    """Our metadata JSON at `path`, None if there is none; a clear error if it is broken."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable checkpoint metadata JSON: {e}") from e
    if not isinstance(data, dict) or SIDECAR_MARKER not in data:
        return None  # some other JSON file: not ours, ignore it
    return data


# --------------------------------------------------------------------------- atomic output
def check_destination(dst: Path, extra: tuple[Path, ...] = (), force: bool = False) -> None:
    """Fail early (before any work) when `dst` cannot or must not be written."""
    parent = dst.parent
    if not parent.exists():
        raise CheckpointError(f"cannot write {dst}: directory {parent} does not exist")
    if not parent.is_dir():
        raise CheckpointError(f"cannot write {dst}: {parent} is not a directory")
    if not force:
        for p in (dst, *extra):
            if p.exists() or p.is_symlink():
                raise CheckpointError(f"{p} already exists (pass --force / force=True to "
                                      "overwrite it)")


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


@contextlib.contextmanager
def atomic_outputs(dst: Path, extra: tuple[Path, ...] = (), force: bool = False
                   ) -> Iterator[dict[Path, Path]]:
    """Write `dst` (and sibling files `extra`, e.g. a sidecar) all or nothing.

    Yields `{final_path: temporary_path}`; the temporaries live in a fresh hidden directory next
    to `dst` (same filesystem), so the final moves are renames. On success every output is
    moved into place (`dst` last, replacing existing ones only with `force`); on any failure the
    temporaries are removed and previous outputs restored, so nothing new is left behind.
    """
    check_destination(dst, extra, force)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    except OSError as e:
        raise CheckpointError(f"cannot write {dst}: {e.strerror or e}") from e
    outputs = {p: tmp / p.name for p in (*extra, dst)}
    moved: list[tuple[Path, Path | None]] = []  # (final, backup of what was there)
    try:
        yield outputs
        check_destination(dst, extra, force)  # nothing appeared meanwhile
        for final, temp in outputs.items():
            if not temp.exists():
                continue
            backup = None
            if final.exists() or final.is_symlink():
                backup = tmp / f"{final.name}.old"
                os.replace(final, backup)
            moved.append((final, backup))
            os.replace(temp, final)
    except BaseException:
        for final, backup in reversed(moved):  # roll back: restore previous outputs
            _remove(final)
            if backup is not None:
                with contextlib.suppress(OSError):
                    os.replace(backup, final)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- npy streams
NPY_MAGIC = b"\x93NUMPY"


def scan_npy_stream(f: BinaryIO, size: int, name: str = "Equinox file"
                    ) -> list[tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of every array in a concatenation of `.npy` records (an Equinox
    `tree_serialise_leaves` file) without reading the data; clear errors on damage."""
    from numpy.lib import format as npy

    out = []
    while f.tell() < size:
        start = f.tell()
        try:
            version = npy.read_magic(f)
            header = (npy.read_array_header_1_0(f) if version == (1, 0)
                      else npy.read_array_header_2_0(f))
        except Exception as e:  # numpy raises ValueError, SyntaxError, TokenError, ...
            raise CheckpointError(
                f"{name}: array #{len(out)} at byte {start}: not a valid .npy record ({e}); the "
                "file is truncated or corrupted") from e
        shape, fortran, dtype = header
        if dtype.hasobject:
            raise CheckpointError(
                f"{name}: array #{len(out)} holds Python objects (pickle): refused")
        if dtype == np.dtype("V2"):  # how jnp.save writes bfloat16
            import ml_dtypes

            dtype = np.dtype(ml_dtypes.bfloat16)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if f.tell() + nbytes > size:
            raise CheckpointError(
                f"{name}: array #{len(out)} of shape {shape} {dtype} needs {nbytes} bytes, only "
                f"{size - f.tell()} left: the file is truncated")
        f.seek(nbytes, os.SEEK_CUR)
        del fortran
        out.append((tuple(shape), dtype))
    return out


def load_npy(f: BinaryIO) -> np.ndarray:
    """One `.npy` record, never unpickling; bfloat16 restored as `jnp.load` does."""
    a = np.load(f, allow_pickle=False)
    if a.dtype == np.dtype("V2"):
        import ml_dtypes

        a = a.view(ml_dtypes.bfloat16)
    return a


def file_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size
