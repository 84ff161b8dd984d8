"""Hub folders: a `config.json` that a `converters.adapters.config_readers` reader claims (HF
transformers' ViT and language models, timm, ...) beside the weights (`model.safetensors`, a sharded
safetensors index with its shards, or `pytorch_model.bin`: the first found, read by its own
format class) in the family's key layout. The config comes from `config.json`, so no
``--arch`` / ``--config`` is needed. `config.json` is read by `zoo.weights.sources.read_json`:
bounded in size and nesting, an object. A folder whose `config.json` names a `model_type` no reader
knows is refused by name, with the known ones.

Written as transformers' `save_pretrained` writes them: `config.json` and `model.safetensors`,
or with ``--shard-size`` shards of at most that size and their index, each shard's header
saying ``{"format": "pt"}``; tensors stream to disk one at a time, in their stored dtype."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, ClassVar

from converters.adapters.config_readers import CONFIG, WEIGHTS, reader_for, readers, writer_for
from converters.checkpoints.checkpoint import Checkpoint, Detection, ordered_state
from converters.checkpoints.format import (
    CheckpointFormat,
    Entry,
    ForeignTree,
    Probe,
    for_detection,
    registered,
)
from converters.checkpoints.formats.safetensors_io import (
    index_json,
    nbytes,
    plan_shards,
    shard_names,
    write_stream,
)
from converters.checkpoints.formats.safetensors_shards import DEFAULT_SHARD_BYTES, INDEX
from converters.checkpoints.io import CheckpointError, ProgressFn
from zoo.configs import Config, ConfigError
from zoo.weights.sources import SourceError, read_json

HF_METADATA = {"format": "pt"}  # what transformers' save_pretrained writes in each header

Found = tuple[dict[str, Any] | None, str, Path | None]  # config.json, why not, weights file


def _hub_json(path: Path) -> Found:
    """The parsed `config.json` of a folder and its weights file, or None and why it is no hub
    folder."""
    config = path / CONFIG
    if not config.is_file():
        return None, f"no {CONFIG}", None
    weights = next((path / w for w in WEIGHTS if (path / w).is_file()), None)
    if weights is None:
        return None, f"{CONFIG} but none of {', '.join(WEIGHTS)}", None
    try:
        raw = read_json(config)
    except SourceError as e:
        raise CheckpointError(str(e)) from e
    return raw, "", weights


def _detect_file(path: Path) -> Detection:
    """The detection of the folder's weights file by the single-file formats."""
    probe = Probe(path)
    for fmt in registered():
        if not fmt.directory and (det := fmt.detect(probe)) is not None:
            return det
    raise CheckpointError(f"{path}: the weights file of the hub folder is in no known format")


class HubFolder(CheckpointFormat):
    """``hub``: a model folder as the Hugging Face Hub stores it (`config.json` and the
    weights), read and written through the family's hub reader and layout."""

    name: ClassVar[str] = "hub"
    directory: ClassVar[bool] = True
    holds_any: ClassVar[bool] = False  # the families with a hub reader, model weights only
    carries_config: ClassVar[bool] = True
    # A config.json a family claims is stronger evidence than the shard index beside it.
    priority: ClassVar[int] = 2

    def _found(self, probe: Probe) -> Found:
        return probe.fact("hub", _hub_json)

    def detect(self, probe: Probe) -> Detection | None:
        raw, _, weights = self._found(probe)
        reader = None if raw is None else reader_for(raw)
        if raw is not None and weights is not None and reader is None and "model_type" in raw:
            raise CheckpointError(  # a transformers folder of a family the zoo does not read
                f"{probe.path / CONFIG}: model_type {raw['model_type']!r} is not one the "
                f"zoo reads; known: {', '.join(_model_types())}")
        if reader is None or weights is None:
            return None
        return self.detection(f"{CONFIG} of the {reader.name} family beside {weights.name} "
                              f"(a {reader.name} hub folder)")

    def rejection(self, probe: Probe) -> str:
        raw, why, _ = self._found(probe)
        if raw is None:
            return f"not a hub folder ({why})"
        return (f"not a hub folder of a known family ({CONFIG} with model_type "
                f"{raw.get('model_type')!r}, architecture {raw.get('architecture')!r}; known: "
                f"{[r.name for r in readers()]})")

    def _parts(self, path: Path, given: Config | None) -> tuple[Config, Path, Detection]:
        """The folder's config (checked against `given`), weights file and its detection."""
        raw, _, weights = _hub_json(path)
        reader = reader_for(raw or {})
        if raw is None or reader is None or weights is None:
            raise CheckpointError(f"{path}: no longer a hub folder of a known family")
        try:
            config = reader.config(raw, str(path / CONFIG))
        except ConfigError as e:
            raise CheckpointError(str(e)) from e
        if given is not None and given != config:
            raise CheckpointError(
                f"{path / CONFIG} gives {config.arch} {config.to_json()}, but --arch/--config "
                f"gave {given.arch} {given.to_json()}; drop --arch/--config to use the folder's")
        return config, weights, _detect_file(weights)

    def read(self, path: Path, det: Detection, given: Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        config, weights, wdet = self._parts(path, given)
        ck = for_detection(wdet).read(weights, wdet, config, progress)
        said = f"config from {path / CONFIG}: {config.arch} {config.to_json()}"
        ck.notes = (said, *ck.notes)
        return ck

    def stored_config(self, path: Path) -> Config | None:
        return self._parts(path, None)[0]

    def read_tree(self, path: Path, weights: str | None = None) -> ForeignTree:
        _, file, wdet = self._parts(path, None)
        return for_detection(wdet).read_tree(file, weights)

    def refuse(self, ck: Checkpoint) -> None:
        if ck.training:
            raise CheckpointError("a hub folder holds model weights only: pass --model-only")
        reader = writer_for(ck.config)
        if reader is None:
            raise CheckpointError(
                f"no hub family writes a {ck.config.arch}; families written: "
                f"{[r.name for r in readers() if r.arch is not None]}")
        try:
            reader.hub_config(ck.config)  # a config its family's class cannot express
        except ConfigError as e:
            raise CheckpointError(str(e)) from e

    def write(self, ck: Checkpoint, data: Path) -> None:
        self.write_counted(ck, data, lambda n: None)

    def write_counted(self, ck: Checkpoint, data: Path, advance: Any) -> None:
        reader = writer_for(ck.config)
        if reader is None:  # refused before staging (`refuse`)
            raise CheckpointError(f"no hub family writes a {ck.config.arch}")
        try:
            hub_config = reader.hub_config(ck.config)
        except ConfigError as e:
            raise CheckpointError(str(e)) from e
        state = ordered_state(ck)
        if reader.adapter is not None:
            state = reader.adapter.from_zoo(state)
        data.mkdir()
        (data / CONFIG).write_text(json.dumps(hub_config, indent=2) + "\n")
        self.write_weights(state, data, advance)

    def write_weights(self, state: dict[str, Any], data: Path, advance: Any) -> None:
        """`model.safetensors`, streamed tensor by tensor."""
        write_stream(data / WEIGHTS[0], state, HF_METADATA, advance)

    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        weights = _hub_json(path)[2]
        if weights is None:
            raise CheckpointError(f"{path}: no longer a hub folder")
        wdet = _detect_file(weights)
        return for_detection(wdet).entries(weights, wdet, ck)


class HubShards(HubFolder):
    """``hub`` with ``--shard-size``: the weights in shards of at most that size beside HF's
    index (`model.safetensors.index.json`), as `save_pretrained(max_shard_size=...)` writes
    them. Read through `HubFolder`, which detects every hub folder."""

    variant: ClassVar[str] = "sharded"
    shards: ClassVar[bool] = True
    max_bytes: int = DEFAULT_SHARD_BYTES

    def detect(self, probe: Probe) -> Detection | None:
        return None

    def sized(self, max_bytes: int) -> CheckpointFormat:
        fmt = copy.copy(self)
        fmt.max_bytes = max_bytes
        return fmt

    def write_weights(self, state: dict[str, Any], data: Path, advance: Any) -> None:
        groups = plan_shards(state, self.max_bytes)
        names = shard_names(len(groups))
        for name, keys in zip(names, groups, strict=True):
            write_stream(data / name, {k: state[k] for k in keys}, HF_METADATA, advance)
        weight_map = {k: name for name, keys in zip(names, groups, strict=True) for k in keys}
        (data / INDEX).write_text(index_json(weight_map, nbytes(state)))


def _model_types() -> list[str]:
    """The `model_type`s of the readers of transformers' families."""
    return [r.model_type for r in readers() if r.model_type is not None]
