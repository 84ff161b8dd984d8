"""`inspect_checkpoint`: what a checkpoint holds and whether it loads into the zoo."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.checkpoints.base import (
    Checkpoint,
    Detection,
    _check_version,
    _dtype_of,
    _first_line,
    _guess_arch,
    parse_config,
)
from converters.checkpoints.detect import _orbax_tree, detect
from converters.checkpoints.eqx import _eqx_leaves, _eqx_like
from converters.checkpoints.io import CheckpointError, file_size, scan_npy_stream
from converters.checkpoints.readwrite import read
from converters.checkpoints.torch import _SAFETENSORS_DTYPES, _load_pt
from converters.core import ConversionError
from converters.optim import param_keys
from zoo.configs import Config, ConfigError, config_from_dict


@dataclass
class Report:
    """What `inspect_checkpoint` found."""

    path: Path
    fmt: str
    reason: str
    config: Config | None
    entries: list[tuple[str, tuple[int, ...], str]]
    kind: str = "model"
    step: int | None = None
    loads: bool | None = None
    problem: str | None = None
    parameters: int | None = None
    stored_values: int = 0
    checkpoint: Checkpoint | None = None
    note: str = ""


def _entries(path: Path, det: Detection, config: Config | None
             ) -> list[tuple[str, tuple[int, ...], str]]:
    if det.fmt in ("canonical", "torch") and det.variant == "safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), "np") as f:
                out = []
                for k in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    s = f.get_slice(k)
                    d = s.get_dtype()
                    out.append((k, tuple(s.get_shape()), _SAFETENSORS_DTYPES.get(d, d.lower())))
                return out
        except Exception as e:
            raise CheckpointError(f"{path}: cannot read the safetensors file ({_first_line(e)})"
                                  ) from e
    if det.fmt == "torch":
        return [(k, tuple(v.shape), str(v.dtype).removeprefix("torch."))
                for k, v in _load_pt(path).items()]
    if det.fmt == "eqx":
        with open(path, "rb") as f:
            headers = scan_npy_stream(f, path.stat().st_size, str(path))
        names = [f"#{i}" for i in range(len(headers))]
        if config is not None:
            dtype = _dtype_of(det.meta) or "float32"
            leaves = _eqx_leaves(_eqx_like(config, dtype, det.meta))
            if len(leaves) == len(headers):
                names = [f"#{i} {n}" for i, (n, _) in enumerate(leaves)]
        return [(n, s, np.dtype(d).name) for n, (s, d) in zip(names, headers, strict=True)]
    return [(k, tuple(getattr(v, "shape", ()) or ()),
             np.dtype(v.dtype).name if getattr(v, "dtype", None) is not None else "scalar")
            for k, v in _orbax_tree(path).items()]


def inspect_checkpoint(path: str | os.PathLike, *, arch: str | None = None,
                       config: Any = None) -> Report:
    """Format, architecture, config, every stored key with shape and dtype, parameter count, and
    whether the checkpoint loads into the zoo (validated against its config)."""
    path = Path(path)
    det = detect(path)
    _check_version(path, det.meta)
    given = parse_config(arch, config)
    stored_cfg, bad_config = None, None
    if det.meta and det.meta.get("config") is not None:
        try:
            stored_cfg = config_from_dict(det.meta["config"])
        except ConfigError as e:
            bad_config = f"{path}: the stored config is invalid: {e}"
    cfg = stored_cfg or given
    entries = _entries(path, det, cfg)
    report = Report(path, det.fmt, det.reason, cfg, entries,
                    kind=(det.meta or {}).get("kind", "model"), step=(det.meta or {}).get("step"),
                    note=det.note)
    if bad_config is not None:
        report.stored_values = sum(math.prod(s) for _, s, _ in entries)
        report.loads, report.problem = False, bad_config
        return report
    report.stored_values = sum(math.prod(s) for _, s, _ in entries)
    if cfg is None:
        keys = [k for k, _, _ in entries]
        report.problem = ("no architecture or config stored: pass --arch/--config to validate"
                          + _guess_arch(keys))
        return report
    try:
        ck = read(path, arch=arch, config=config)
    except (ConversionError, CheckpointError, ConfigError) as e:
        report.loads, report.problem = False, str(e)
        return report
    report.loads, report.checkpoint, report.config = True, ck, ck.config
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
