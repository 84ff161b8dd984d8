"""`read` and `write`: any registered format, through the canonical `Checkpoint`."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from converters.checkpoints.base import Checkpoint
from converters.checkpoints.configs import parse_config
from converters.checkpoints.destination import publishing
from converters.checkpoints.detect import detect
from converters.checkpoints.format import for_detection, for_writing, foreign_suffix
from converters.checkpoints.io import CheckpointError, ProgressFn, ProgressTask, first_line
from converters.checkpoints.metadata import check_version, write_json
from converters.checkpoints.staging import digest
from converters.core import ConversionError


class DestinationWarning(UserWarning):
    """A destination named unlike the files of its format (e.g. ``out.txt`` for torch)."""


def read(path: str | os.PathLike, *, arch: str | None = None, config: Any = None,
         model_only: bool = False, progress: ProgressFn | None = None,
         cast: Any = None, weights: str | None = None) -> Checkpoint:
    """Read any supported checkpoint into a validated canonical `Checkpoint`.

    `arch` / `config` are needed only when the file does not carry them (e.g. a bare
    ``torch.save(model.state_dict())``); if both exist they must agree. `cast` (a floating
    dtype) converts every floating array explicitly; nothing is ever cast without it.
    `weights` ("main" or "ema") chooses the live or the EMA weights of a training checkpoint
    holding both (the live ones by default, and `Checkpoint.notes` says so).
    """
    path = Path(path)
    det = detect(path)
    check_version(path, det.meta)
    fmt, given = for_detection(det), parse_config(arch, config)
    ck = (fmt.read(path, det, given, progress) if weights is None else
          fmt.read_weights(path, det, given, progress, weights))
    if model_only:
        ck = ck.model_only()
    if cast is not None:
        ck = ck.cast(cast)
    ck.source = det
    try:
        ck.validate()
    except ConversionError as e:
        raise type(e)(f"{path}: {e}") from e
    return ck


def write(ck: Checkpoint, path: str | os.PathLike, fmt: str, *, force: bool = False,
          progress: ProgressFn | None = None, source: str | os.PathLike | None = None) -> Path:
    """Write a canonical checkpoint in format `fmt`, validated first, atomically (see
    `converters.checkpoints.destination` for the rules; `source` is refused as DST).

    A `path` whose extension names another format is refused; one with an extension unusual
    for `fmt` gets a `DestinationWarning`.
    """
    path = Path(path)
    target = for_writing(fmt, path)
    ck.validate()
    target.refuse(ck)
    unusual = foreign_suffix(target, path)
    if unusual is not None:
        warnings.warn(unusual, DestinationWarning, stacklevel=2)
    with publishing(path, with_sidecar=target.sidecar, force=force, source=source) as staged:
        task = ProgressTask(progress, "writing", 1)
        try:
            target.write(ck, staged.data)
            if target.sidecar:
                write_json(staged.sidecar, {**target.metadata(ck), "data": digest(staged.data)})
        except (CheckpointError, ConversionError):
            raise
        except OSError as e:
            raise CheckpointError(f"cannot write {path}: {e.strerror or e}") from e
        except Exception as e:  # orbax / tensorstore wrap I/O errors in their own types
            raise CheckpointError(f"cannot write {path}: {type(e).__name__}: "
                                  f"{first_line(e)}") from e
        task.advance()
    return path
