"""`read` and `write`: any registered format, through the canonical `Checkpoint`."""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any

import canonical
from canonical.errors import StateMismatchError
from converters import adapters
from converters.checkpoints import backbone
from converters.checkpoints.checkpoint import Checkpoint, Placement, ordered_state
from converters.checkpoints.configs import parse_config
from converters.checkpoints.destination import publishing
from converters.checkpoints.detect import detect
from converters.checkpoints.format import (
    checkpoint_bytes,
    for_detection,
    for_writing,
    foreign_suffix,
    registered,
)
from converters.checkpoints.formats.safetensors_io import parse_size
from converters.checkpoints.io import (
    CheckpointError,
    ProgressFn,
    ProgressTask,
    UsageError,
    first_line,
)
from converters.checkpoints.metadata import check_version, write_json
from converters.checkpoints.sources import local
from converters.core import ConversionError, canonical_spec
from zoo.weights.loading import adapt as adapt_state


class DestinationWarning(UserWarning):
    """A destination named unlike the files of its format (e.g. ``out.txt`` for torch)."""


def read(path: str | os.PathLike, *, arch: str | None = None, config: Any = None,
         model_only: bool = False, progress: ProgressFn | None = None,
         cast: Any = None, adapt: bool = False, seed: int = 0,
         weights: str | None = None, placement: Placement | None = None) -> Checkpoint:
    """Read any supported checkpoint into a validated canonical `Checkpoint`: a path, or a
    source (``hf-hub:ORG/REPO[@REVISION]``, ``local-dir:PATH``: `converters.checkpoints.sources`).

    `arch` / `config` are needed only when the file does not carry them (e.g. a bare
    ``torch.save(model.state_dict())``); if both exist they must agree. `cast` (a floating
    dtype) converts every floating array explicitly; nothing is ever cast without it.
    `weights` ("main" or "ema") chooses the live or the EMA weights of a training checkpoint
    holding both (the live ones by default, and `Checkpoint.notes` says so). `placement`
    restores the arrays straight onto a mesh where the format can (orbax: each device reads
    its shards), else they are read to the host.

    With `adapt`, `arch` / `config` give the target: the file's model arrays (read with its own
    config when it carries one) are adapted to it by the architecture's `ADAPTERS` (another
    num_classes, ViT image_size or in_channels, as timm's pretrained loading; a new classifier
    is drawn from `seed`), each change listed in the Checkpoint's `adapted`; optimizer state and
    step are dropped.
    """
    path = local(path)
    det = detect(path)
    check_version(path, det.meta)
    given = parse_config(arch, config)
    ck = _read_as_stored(path, det, given, progress, adapt, weights, placement)
    if adapt:
        if given is None:
            raise UsageError("adapting a checkpoint needs the target model: pass --arch / "
                             "--config (arch= / config=)")
        if ck.config.arch != given.arch:
            raise CheckpointError(f"{path} holds a {ck.config.arch}, not a {given.arch}")
        state, notes = adapt_state(ck.state, given, seed)
        ck = Checkpoint(given, state, layout=ck.layout, notes=ck.notes, adapted=tuple(notes))
    if model_only:
        ck = ck.model_only()
    if cast is not None:
        ck = ck.cast(cast)
    ck.source = det
    try:
        ck.validate()
    except ConversionError as e:
        fix = backbone.refusal_line(ck.state, ck.config)  # a backbone's file: the fix
        if not fix:
            raise type(e)(f"{path}: {e}") from e
        if backbone.headless_fix(ck.state, ck.config):
            raise CheckpointError(f"{path}: {fix}") from e
        # not a foreign layout to match by structure: the keys are the model's, unprefixed
        raise StateMismatchError("\n".join((f"{path}: {first_line(e)}", fix,
                                            *str(e).splitlines()[1:]))) from e
    return ck


def adapted(ck: Checkpoint) -> Checkpoint:
    """`ck` with a foreign layout's keys renamed to the canonical ones, by the adapter whose
    rules cover them (`converters.adapters.to_canonical_names`, as `import_state` does), the
    keys it leaves out noted, and a tied array's alias dropped where it equals its source
    (`Config.ties`: transformers' `lm_head.weight`; refused by name where it differs); `ck`
    itself when its keys are canonical or no adapter fits."""
    if ck.config.ties and any(t.alias in ck.state for t in ck.config.ties):
        ck = dataclasses.replace(ck, state=canonical.untie(ck.state, ck.config.ties),
                                 _validated=None)
    if set(ck.state) == set(canonical_spec(ck.config)):
        return ck
    as_model = backbone.as_backbone(ck.state, ck.config)  # transformers' base model's keys
    if as_model is not None:
        ck = dataclasses.replace(ck, state=as_model[0], _validated=None,
                                 notes=(*ck.notes, *as_model[1]))
        ck.state = ordered_state(ck)
        return ck
    state, adapter, notes = adapters.to_canonical_names(ck.state, ck.config.arch)
    if adapter is None:
        return ck
    ck = dataclasses.replace(ck, state=state, layout=adapter.name, _validated=None,
                             notes=(*ck.notes, *notes))
    ck.state = ordered_state(ck)
    return ck


def _read_as_stored(path: Path, det: Any, given: Any, progress: ProgressFn | None,
                    adapt: bool, weights: str | None = None,
                    placement: Placement | None = None) -> Checkpoint:
    """The file's arrays, not yet validated; with `adapt`, read with the file's own config when
    it carries one (`given` is then the target, not a claim about the file); `weights` and
    `placement` as in `read`."""
    fmt = for_detection(det)
    stored = adapt and (fmt.carries_config or (det.meta is not None and
                                               det.meta.get("config") is not None))
    claim = None if stored else given
    if weights is not None:
        ck = fmt.read_weights(path, det, claim, progress, weights)
    elif placement is not None:
        ck = fmt.read_placed(path, det, claim, progress, placement)
    else:
        ck = fmt.read(path, det, claim, progress)
    try:
        return adapted(ck)  # a foreign layout's keys renamed (converters.adapters)
    except ConversionError as e:
        raise type(e)(f"{path}: {e}") from e


def read_state(path: str | os.PathLike, config: Any) -> dict[str, Any]:
    """The model arrays of the checkpoint at `path` as stored (for `zoo.create(weights=...)`,
    which adapts them to `config`); `path` may be a source (``hf-hub:...``)."""
    path = local(path)
    det = detect(path)
    check_version(path, det.meta)
    ck = _read_as_stored(path, det, config, None, adapt=True)
    if ck.config.arch != config.arch:
        raise CheckpointError(f"{path} holds a {ck.config.arch}, not a {config.arch}")
    return ck.state


def write(ck: Checkpoint, path: str | os.PathLike, fmt: str, *, force: bool = False,
          progress: ProgressFn | None = None, source: str | os.PathLike | None = None,
          shard_size: int | str | None = None, layout: str | None = None) -> Path:
    """Write a canonical checkpoint in format `fmt`, validated first, atomically (see
    `converters.checkpoints.destination` for the rules; `source` is refused as DST).

    A `path` whose extension names another format is refused; one with an extension unusual
    for `fmt` gets a `DestinationWarning`. `shard_size` (bytes, or ``"5GB"``) writes a folder
    of shards of at most that size with an index, where the format has shards. `layout`: the
    name of a foreign layout (`converters.adapters`, e.g. "torchvision-convnext") whose names
    the state is written in, by a format that writes them (torch); read back, the adapter
    renames them again.
    """
    path = Path(path)
    target = for_writing(fmt, path, shard_bytes(shard_size))
    ck.validate()
    target.refuse(ck)
    if layout:
        ck = in_layout(ck, layout, target)
    unusual = foreign_suffix(target, path)
    if unusual is not None:
        warnings.warn(unusual, DestinationWarning, stacklevel=2)
    with publishing(path, with_sidecar=target.sidecar, force=force, source=source) as staged:
        task = ProgressTask(progress, "writing", checkpoint_bytes(ck))
        try:
            if target.sidecar:
                data = target.write_hashed(ck, staged.data, task.advance)
                write_json(staged.sidecar, {**target.metadata(ck), "data": data})
            else:
                target.write_counted(ck, staged.data, task.advance)
        except (CheckpointError, ConversionError):
            raise
        except OSError as e:
            raise CheckpointError(f"cannot write {path}: {e.strerror or e}") from e
        except Exception as e:  # orbax / tensorstore wrap I/O errors in their own types
            raise CheckpointError(f"cannot write {path}: {type(e).__name__}: "
                                  f"{first_line(e)}") from e
    return path


def in_layout(ck: Checkpoint, layout: str, target: Any) -> Checkpoint:
    """`ck` to be written in the foreign `layout`'s names by format `target`; UsageError when
    the format cannot or the layout is another architecture's, AdapterError (naming the
    known ones) for an unknown layout or a key it has no place for."""
    if not target.writes_layouts:
        writers = [f.name for f in registered() if f.writes_layouts]
        raise UsageError(f"--layout {layout}: the {target.name} format stores the zoo's own "
                         f"names; a foreign layout is written --to {' or '.join(writers)}")
    adapter = adapters.get(layout)
    if adapter.arch != ck.config.arch:
        raise UsageError(f"--layout {layout} holds a {adapter.arch} ({adapter.description}), "
                         f"not a {ck.config.arch}")
    adapter.from_zoo(ck.state)  # every key has a place (AdapterError names one that has not)
    return dataclasses.replace(ck, write_layout=layout)


def shard_bytes(size: int | str | None) -> int | None:
    """A shard size in bytes (None: not sharded); UsageError naming a bad one."""
    if size is None:
        return None
    try:
        return parse_size(size)
    except ValueError as e:
        raise UsageError(str(e)) from None
