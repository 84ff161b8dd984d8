"""`read` and `write`: dispatch on the format to the readers and writers of each family."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from converters.checkpoints.base import (
    FORMATS,
    Checkpoint,
    _check_version,
    _first_line,
    _meta,
    _Task,
    _write_json,
    check_target_dtype,
    parse_config,
)
from converters.checkpoints.destination import digest, publishing
from converters.checkpoints.detect import detect
from converters.checkpoints.eqx import _read_eqx, _write_eqx, save_eqx_tree
from converters.checkpoints.io import CheckpointError, ProgressFn, UsageError, has_sidecar
from converters.checkpoints.orbax import _read_orbax, _write_orbax, save_orbax_tree
from converters.checkpoints.torch import (
    _read_safetensors,
    _read_torch,
    _write_safetensors,
    _write_torch,
)
from converters.core import ConversionError, from_canonical
from converters.optim import to_native_opt
from zoo.weights import adapt as adapt_state

# How each JAX library stores a model's `zoo.interface(impl).checkpoint_tree` (no metadata).
TREE_WRITERS = {"eqx": save_eqx_tree, "linen": save_orbax_tree, "nnx": save_orbax_tree}


def read(path: str | os.PathLike, *, arch: str | None = None, config: Any = None,
         model_only: bool = False, progress: ProgressFn | None = None,
         cast: Any = None, adapt: bool = False, seed: int = 0) -> Checkpoint:
    """Read any supported checkpoint into a validated canonical `Checkpoint`.

    `arch` / `config` are needed only when the file does not carry them (e.g. a bare
    ``torch.save(model.state_dict())``); if both exist they must agree. `cast` (a floating
    dtype) converts every floating array explicitly; nothing is ever cast without it.

    With `adapt`, `arch` / `config` give the target: the file's model arrays (read with its own
    config when it carries one) are adapted to it by the architecture's `ADAPTERS` (another
    num_classes, ViT image_size or in_channels, as timm's pretrained loading; a new classifier
    is drawn from `seed`), each change listed in the Checkpoint's `notes`; optimizer state and
    step are dropped.
    """
    path = Path(path)
    det = detect(path)
    _check_version(path, det.meta)
    given = parse_config(arch, config)
    ck = _read_as_stored(path, det, given, progress, adapt)
    if adapt:
        if given is None:
            raise UsageError("adapting a checkpoint needs the target model: pass --arch / "
                             "--config (arch= / config=)")
        if ck.config.arch != given.arch:
            raise CheckpointError(f"{path} holds a {ck.config.arch}, not a {given.arch}")
        state, notes = adapt_state(ck.state, given, seed)
        ck = Checkpoint(given, state, notes=notes)
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


def _read_as_stored(path: Path, det: Any, given: Any, progress: ProgressFn | None,
                    adapt: bool) -> Checkpoint:
    """The file's arrays, not yet validated; with `adapt`, read with the file's own config when
    it carries one (`given` is then the target, not a claim about the file)."""
    reader = {"eqx": _read_eqx, "linen": _read_orbax, "nnx": _read_orbax,
              "canonical": _read_safetensors, "torch": _read_torch}[det.fmt]
    stored = adapt and det.meta is not None and det.meta.get("config") is not None
    return reader(path, det, None if stored else given, progress)


def read_state(path: str | os.PathLike, config: Any) -> dict[str, Any]:
    """The model arrays of the checkpoint at `path` as stored (for `zoo.create(weights=...)`,
    which adapts them to `config`)."""
    path = Path(path)
    det = detect(path)
    _check_version(path, det.meta)
    ck = _read_as_stored(path, det, config, None, adapt=True)
    if ck.config.arch != config.arch:
        raise CheckpointError(f"{path} holds a {ck.config.arch}, not a {config.arch}")
    return ck.state


def write(ck: Checkpoint, path: str | os.PathLike, fmt: str, *, force: bool = False,
          progress: ProgressFn | None = None, source: str | os.PathLike | None = None) -> Path:
    """Write a canonical checkpoint in format `fmt`, validated first, atomically (see
    `converters.checkpoints.destination` for the rules; `source` is refused as DST)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; formats: {list(FORMATS)}")
    path = Path(path)
    dtype = ck.validate()
    if fmt == "torch" and ck.training:
        raise CheckpointError(
            "the torch format holds a model state_dict only, but this checkpoint has optimizer "
            "state / a step: pass --model-only (model_only=True) to drop them, or use another "
            "format")
    check_target_dtype(ck, fmt, dtype)
    writer = {"eqx": _write_eqx, "linen": _write_orbax, "nnx": _write_orbax,
              "canonical": _write_safetensors, "torch": _write_torch}[fmt]
    side = has_sidecar(path, fmt)
    with publishing(path, with_sidecar=side, force=force, source=source) as staged:
        task = _Task(progress, "writing", 2)
        native = _native(ck, fmt)
        task.advance()
        try:
            writer(ck, fmt, dtype, native, staged.data, path)
            if side:
                _write_json(staged.sidecar, {**_meta(ck, fmt, dtype),
                                             "data": digest(staged.data)})
        except (CheckpointError, ConversionError):
            raise
        except OSError as e:
            raise CheckpointError(f"cannot write {path}: {e.strerror or e}") from e
        except Exception as e:  # orbax / tensorstore wrap I/O errors in their own types
            raise CheckpointError(f"cannot write {path}: {type(e).__name__}: "
                                  f"{_first_line(e)}") from e
        task.advance()
    return path


def _native(ck: Checkpoint, fmt: str) -> tuple[Any, Any]:
    """(native model, native optimizer state or None) for the JAX formats."""
    if fmt not in ("eqx", "linen", "nnx"):
        return None, None
    model = from_canonical(ck.state, ck.config, fmt)
    opt = None
    if ck.optimizer is not None:
        opt = to_native_opt(ck.optimizer, ck.state, ck.config, fmt, ordered=fmt == "eqx")
    return model, opt
