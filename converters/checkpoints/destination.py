"""Where a checkpoint is written: every destination rule in one place.

- SRC and DST are resolved (symlinks, ``..``, relative or absolute) and must be neither the same
  path nor one inside the other, whatever ``force`` says.
- An existing DST is replaced only with ``force`` and only when it is a checkpoint of a known
  format or a dangling symbolic link (replaced itself, not followed); anything else is refused,
  naming what is there.
- A lock (``fcntl.flock`` on a hidden file beside DST) refuses a concurrent writer.
- Everything is written into one hidden temporary directory beside DST (same filesystem) and
  published by renames: the data first (one atomic rename, or the old checkpoint moved aside into
  the temporary directory first), then the sidecar, which records the data's size and SHA-256 so
  that a sidecar left describing other data is recognisably stale. A data file gets the mode
  the umask gives (whatever mode its writer's library chose).
- Temporaries are named ``.zoo-tmp-<hash of DST name>-<pid>`` (short whatever the DST name); a
  later run removes those of dead processes, putting back an old checkpoint a crash left there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from converters.checkpoints.detect import detect
from converters.checkpoints.io import (
    CheckpointError,
    UsageError,
    apply_umask,
    read_json_meta,
    sidecar_path,
)
from converters.checkpoints.staging import (
    DATA,
    LOCK_PREFIX,
    OLD,
    SIDECAR,
    TARGET,
    TMP_PREFIX,
    digest,
    pid_alive,
    tag,
)


def resolve(path: str | os.PathLike) -> Path:
    """The absolute path with symlinks and ``..`` resolved (DST itself need not exist)."""
    return Path(os.path.abspath(Path(path).expanduser())).resolve()


def check_pair(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Refuse a DST that is SRC, lies inside it, or contains it (however either is spelled)."""
    s, d = resolve(src), resolve(dst)
    if s == d:
        raise UsageError(f"refusing to write {dst}: it is the source {src} ({s})")
    if s in d.parents:
        raise UsageError(f"refusing to write {dst}: it lies inside the source {src} ({s})")
    if d in s.parents:
        raise UsageError(f"refusing to write {dst}: it contains the source {src} ({d})")
    with contextlib.suppress(OSError):
        if d.exists() and os.path.samefile(s, d):  # hard links
            raise UsageError(f"refusing to write {dst}: it is the source {src}")


def resolve_destination(dst: str | os.PathLike) -> Path:
    """`resolve(dst)`, except that a dangling symbolic link is itself the destination (it exists:
    it is refused without ``force`` and replaced, not followed, with it)."""
    path = Path(os.path.abspath(Path(dst).expanduser()))
    if path.is_symlink() and not path.exists():
        return resolve(path.parent) / path.name
    return resolve(path)


def describe_existing(dst: Path) -> str | None:
    """What is at `dst` ("a nnx checkpoint", "a dangling symbolic link ..."), None if nothing;
    refuses anything else."""
    if dst.is_symlink() and not dst.exists():
        return f"a dangling symbolic link to {os.readlink(dst)}"
    if not dst.exists():
        return None
    try:
        return f"a {detect(dst).fmt} checkpoint"
    except CheckpointError as e:
        kind = "directory" if dst.is_dir() else "file"
        raise CheckpointError(f"refusing to replace {dst}: it is a {kind} that is not a "
                              f"checkpoint of a known format ({e})") from e


def _sidecar_ours(side: Path) -> bool:
    try:
        return read_json_meta(side) is not None
    except CheckpointError:
        return False


@dataclass
class Staging:
    """The temporary paths a writer fills: `data` (file or directory) and `sidecar`."""

    dir: Path
    data: Path
    sidecar: Path


def clean_stale(parent: Path, own_tag: str) -> None:
    """Remove our temporaries left by dead processes in `parent`. For `own_tag` (whose lock we
    hold) an old checkpoint moved aside is put back when nothing replaced it, and a sidecar that
    matches the published data is published (the crash fell between the two renames)."""
    for tmp in parent.glob(TMP_PREFIX + "*"):
        name = tmp.name[len(TMP_PREFIX):]
        t, _, pid = name.rpartition("-")
        if not pid.isdigit() or not tmp.is_dir() or pid_alive(int(pid)):
            continue
        if t == own_tag:
            _recover(parent, tmp)
        elif (tmp / OLD).exists() or (tmp / OLD).is_symlink():
            continue  # another destination's rescue: left for its own next run
        shutil.rmtree(tmp, ignore_errors=True)


def _recover(parent: Path, tmp: Path) -> None:
    try:
        target = parent / (tmp / TARGET).read_text()
    except (OSError, UnicodeDecodeError):
        return
    if target.parent != parent:
        return
    old = tmp / OLD
    if (old.exists() or old.is_symlink()) and not (target.exists() or target.is_symlink()):
        os.replace(old, target)
    side = tmp / SIDECAR
    if side.is_file() and target.is_file() and not (tmp / DATA).exists():
        meta = read_json_meta(side)
        if meta is not None and meta.get("data") == digest(target):
            os.replace(side, sidecar_path(target))


@contextlib.contextmanager
def lock(dst: Path) -> Iterator[None]:
    """Hold an exclusive lock on `dst` (a hidden lock file beside it, removed afterwards)."""
    path = dst.parent / f"{LOCK_PREFIX}{tag(dst)}"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise CheckpointError(f"cannot write {dst}: another process is writing it "
                                      "right now") from e
            raise
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break  # still the lock file: not unlinked by a finishing writer meanwhile
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def _check_parent(dst: Path) -> None:
    parent = dst.parent
    if not dst.name or dst == parent:
        raise UsageError(f"cannot write {dst}: not a file or directory name")
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise CheckpointError(f"cannot write {dst}: {parent} {why}")


def _check_outputs(dst: Path, with_sidecar: bool, force: bool) -> None:
    there = describe_existing(dst)
    if there is not None and not force:
        raise CheckpointError(f"{dst} already exists ({there}; pass --force / force=True to "
                              "replace it)")
    side = sidecar_path(dst)
    if with_sidecar and (side.exists() or side.is_symlink()) and not _sidecar_ours(side):
        raise CheckpointError(f"refusing to replace {side}: it is not a sidecar written by this "
                              "tool")


@contextlib.contextmanager
def publishing(dst: str | os.PathLike, *, with_sidecar: bool, force: bool = False,
               source: str | os.PathLike | None = None) -> Iterator[Staging]:
    """Stage a checkpoint for `dst` and publish it when the block ends without an error.

    Yields a `Staging` whose `data` (and `sidecar`, when `with_sidecar`) the caller fills. On any
    failure nothing new is left behind and what was at `dst` is untouched.
    """
    if source is not None:
        check_pair(source, dst)
    dst = resolve_destination(dst)
    _check_parent(dst)
    with lock(dst):
        clean_stale(dst.parent, tag(dst))
        _check_outputs(dst, with_sidecar, force)
        tmp = dst.parent / f"{TMP_PREFIX}{tag(dst)}-{os.getpid()}"
        try:
            tmp.mkdir()
            (tmp / TARGET).write_text(dst.name)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"cannot write {dst}: {e.strerror or e}") from e
        try:
            staged = Staging(tmp, tmp / DATA, tmp / SIDECAR)
            yield staged
            if staged.data.is_file():
                apply_umask(staged.data)  # some writers (safetensors) create files 0600
            _check_outputs(dst, with_sidecar, force)  # nothing foreign appeared meanwhile
            _publish(dst, staged, with_sidecar)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _publish(dst: Path, staged: Staging, with_sidecar: bool) -> None:
    old = staged.dir / OLD
    exists = dst.exists() or dst.is_symlink()
    if exists and (dst.is_dir() or staged.data.is_dir()):
        os.replace(dst, old)  # a directory cannot be renamed over: move the old one aside
        try:
            os.replace(staged.data, dst)
        except BaseException:
            os.replace(old, dst)
            raise
    else:
        os.replace(staged.data, dst)
    side = sidecar_path(dst)
    if with_sidecar:
        os.replace(staged.sidecar, side)
    elif (side.exists() or side.is_symlink()) and _sidecar_ours(side):
        side.unlink()  # the sidecar of the checkpoint just replaced
