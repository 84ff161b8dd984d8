"""Low-level file handling for checkpoints: errors, sidecars, progress, file modes, npy scans.

Nothing here knows about models: `converters.checkpoints` builds on it.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

SIDECAR_SUFFIX = ".json"  # Equinox / PyTorch files: `model.eqx` + `model.eqx.json`
DIR_METADATA = "zoo.json"  # orbax directories: `<dir>/zoo.json`
SIDECAR_MARKER = "zoo_checkpoint"  # key that identifies our JSON (value: format version)
FORMAT_VERSION = 1  # the version of the metadata this code writes (and the newest it reads)

# A progress callback: (description, bytes completed, total bytes or None). Called with
# completed=0 first.
ProgressFn = Callable[[str, int, "int | None"], None]


class CheckpointError(ValueError):
    """A checkpoint file cannot be read, detected or written; the message says why."""


class UsageError(CheckpointError):
    """The arguments themselves are wrong (e.g. DST is the source): exit status 2."""


def no_progress(description: str, completed: int, total: int | None) -> None:
    del description, completed, total


class ProgressTask:
    """One task of a `ProgressFn`: announced on creation, then advanced step by step."""

    def __init__(self, progress: ProgressFn | None, description: str, total: int | None):
        self.progress, self.description, self.total, self.done = (
            progress or no_progress, description, total, 0)
        self.progress(description, 0, total)

    def advance(self, n: int = 1) -> None:
        self.done += n
        self.progress(self.description, self.done, self.total)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name if it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def umask() -> int:
    """The process's umask, read without changing it where Linux tells it."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: Path) -> None:
    """Give a written file the mode a plain ``open(path, "w")`` gives (0644 under umask 022)."""
    os.chmod(path, 0o666 & ~umask())


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
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: unreadable checkpoint metadata JSON: {e}") from e
    if not isinstance(data, dict) or SIDECAR_MARKER not in data:
        return None  # some other JSON file: not ours, ignore it
    return data


# --------------------------------------------------------------------------- npy streams
NPY_MAGIC = b"\x93NUMPY"


def scan_npy_stream(f: BinaryIO, size: int, name: str = "Equinox file"
                    ) -> list[tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of every array in a concatenation of `.npy` records (an Equinox
    `tree_serialise_leaves` file) without reading the data; clear errors on damage."""
    return [(r.shape, r.dtype) for r in npy_records(f, size, name)]


@dataclass(frozen=True)
class NpyRecord:
    """Where one `.npy` record's data lies in a file, and what it holds."""

    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool


def npy_records(f: BinaryIO, size: int, name: str = "Equinox file") -> list[NpyRecord]:
    """Every record of a concatenation of `.npy` records, its data unread (`scan_npy_stream`)."""
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
        if any(not isinstance(n, int) or n < 0 for n in shape):
            raise CheckpointError(f"{name}: array #{len(out)} at byte {start}: invalid shape "
                                  f"{shape}: the file is corrupted")
        nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
        if nbytes > size - f.tell():
            raise CheckpointError(
                f"{name}: array #{len(out)} of shape {shape} {dtype} needs {nbytes} bytes, only "
                f"{size - f.tell()} left: the file is truncated")
        out.append(NpyRecord(f.tell(), tuple(shape), dtype, bool(fortran)))
        f.seek(nbytes, os.SEEK_CUR)
    return out


def load_npy(f: BinaryIO) -> np.ndarray:
    """One `.npy` record, never unpickling; bfloat16 restored as `jnp.load` does."""
    a = np.load(f, allow_pickle=False)
    if a.dtype == np.dtype("V2"):
        import ml_dtypes

        a = a.view(ml_dtypes.bfloat16)
    return a


# --------------------------------------------------------------------------- mapped arrays
class FileSlice:
    """An array stored at `offset` in a file, read afresh each time it is used (`__array__`):
    what a converter that consumes each array once should hold instead of a memory map, whose
    pages would stay resident (and counted) once read."""

    def __init__(self, path: str | os.PathLike, offset: int, shape: tuple[int, ...],
                 dtype: np.dtype):
        self.path, self.offset, self.shape, self.dtype = path, offset, tuple(shape), dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        del copy  # always a new array
        raw = np.fromfile(self.path, np.uint8, count=self.nbytes, offset=self.offset)
        a = raw.view(self.dtype).reshape(self.shape)
        return a if dtype is None else a.astype(dtype)


def detached(a: Any) -> Any:
    """A `FileSlice` of a memory-mapped file array (`np.memmap` of its own region), else `a`."""
    if isinstance(a, np.memmap) and a.filename and isinstance(a.base, mmap.mmap):
        return FileSlice(a.filename, a.offset, a.shape, a.dtype)
    return a


TILE = 256  # a tile of 256 x 256 float32 (256 KiB) of source and copy fits in the L2 cache


def contiguous(a: Any) -> np.ndarray:
    """`a` as a C-contiguous array; a strided 2-D one (a transposed kernel) copied tile by
    tile: NumPy's own copy walks the source a column at a time, missing the cache at
    every element (2-3x slower for the large kernels of a checkpoint)."""
    a = np.asarray(a)
    if a.flags.c_contiguous or a.ndim != 2 or min(a.shape) < 2 * TILE:
        return np.ascontiguousarray(a)
    out = np.empty(a.shape, a.dtype)
    for i in range(0, a.shape[0], TILE):
        for j in range(0, a.shape[1], TILE):
            out[i:i + TILE, j:j + TILE] = a[i:i + TILE, j:j + TILE]
    return out


def file_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size
