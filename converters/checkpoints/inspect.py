"""`inspect_checkpoint`: what a checkpoint holds and whether it loads into the zoo."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.checkpoints.checkpoint import Checkpoint
from converters.checkpoints.configs import guess_arch, parse_config, resolve_config
from converters.checkpoints.detect import detect
from converters.checkpoints.format import Entry, for_detection
from converters.checkpoints.io import CheckpointError, file_size
from converters.checkpoints.metadata import check_version
from converters.checkpoints.readwrite import read
from converters.checkpoints.sources import local
from converters.core import ConversionError, KeyMismatchError
from converters.optim import param_keys
from zoo.configs import Config, ConfigError


@dataclass
class Report:
    """What `inspect_checkpoint` found."""

    path: Path
    fmt: str
    reason: str
    config: Config | None
    entries: list[Entry]
    kind: str = "model"
    step: int | None = None
    loads: bool | None = None
    problem: str | None = None
    parameters: int | None = None
    stored_values: int = 0
    checkpoint: Checkpoint | None = None
    note: str = ""
    names_differ: bool = False  # does not load because its key names are not the zoo's


def inspect_checkpoint(path: str | os.PathLike, *, arch: str | None = None,
                       config: Any = None) -> Report:
    """Format, architecture, config, every stored key with shape and dtype, parameter count, and
    whether the checkpoint loads into the zoo (validated against its config). `path` may be a
    source (``hf-hub:...``, ``local-dir:...``)."""
    path = local(path)
    det = detect(path)
    check_version(path, det.meta)
    fmt = for_detection(det)
    given = parse_config(arch, config)
    report = Report(path, det.fmt, det.reason, given, [],
                    kind=(det.meta or {}).get("kind", "model"), step=(det.meta or {}).get("step"),
                    note=det.note)
    try:
        report.config = resolve_config(path, det.meta, given)
    except CheckpointError as e:
        if det.meta and det.meta.get("config") is not None:  # stored, and invalid or contradicted
            report.loads, report.problem = False, str(e)
    if (report.config is not None or fmt.carries_config) and report.loads is None:
        try:
            report.checkpoint = read(path, arch=arch, config=config)
        except (ConversionError, CheckpointError, ConfigError) as e:
            report.loads, report.problem = False, str(e)
            report.names_differ = isinstance(e, KeyMismatchError)
    report.entries = fmt.entries(path, det, report.checkpoint)
    report.stored_values = sum(math.prod(s) for _, s, _ in report.entries)
    ck = report.checkpoint
    if ck is None:
        if report.loads is None:
            keys = [k for k, _, _ in report.entries]
            report.problem = ("no architecture or config stored: pass --arch/--config to "
                              "validate" + guess_arch(keys))
        return report
    report.loads, report.config = True, ck.config
    report.kind, report.step = ("training" if ck.training else "model"), ck.step
    report.parameters = sum(int(np.prod(ck.state[k].shape, dtype=np.int64))
                            for k in param_keys(ck.config))
    return report


def disk_size(path: str | os.PathLike) -> int:
    """Bytes on disk of a checkpoint file or directory (0 if unreadable)."""
    try:
        return file_size(Path(path))
    except OSError:
        return 0
