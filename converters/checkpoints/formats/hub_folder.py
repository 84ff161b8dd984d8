"""Hub folders: a ``config.json`` that a registered `HubConfigReader` claims (timm's, see
`converters.checkpoints.hub`) beside the weights file (``model.safetensors`` or
``pytorch_model.bin``, read by its own format class). The config comes from ``config.json``,
so no ``--arch`` / ``--config`` is needed. Read only."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from converters.checkpoints.base import Checkpoint, Detection
from converters.checkpoints.format import (
    CheckpointFormat,
    Entry,
    ForeignTree,
    Probe,
    for_detection,
    registered,
)
from converters.checkpoints.hub import HUB_CONFIG, HubConfigReader, read_hub_config
from converters.checkpoints.io import CheckpointError, ProgressFn
from zoo.configs import Config

WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # as the Hub stores them, first found


def _hub(path: Path) -> tuple[dict, HubConfigReader, Path] | None:
    found = read_hub_config(path)
    weights = next((path / w for w in WEIGHTS if (path / w).is_file()), None)
    return None if found is None or weights is None else (*found, weights)


def _detect_file(path: Path) -> Detection:
    probe = Probe(path)
    for fmt in registered():
        if not fmt.directory and fmt.writable and (det := fmt.detect(probe)) is not None:
            return det
    raise CheckpointError(f"{path}: the weights file of the hub folder is in no known format")


class HubFolder(CheckpointFormat):
    """``hub``: a model folder as timm (and the Hugging Face Hub) stores it."""

    name: ClassVar[str] = "hub"
    directory: ClassVar[bool] = True
    writable: ClassVar[bool] = False

    def detect(self, probe: Probe) -> Detection | None:
        hub = probe.fact("hub", _hub)
        if hub is None:
            return None
        _, reader, weights = hub
        return self.detection(f"{reader.name} hub folder: {HUB_CONFIG} beside {weights.name}")

    def rejection(self, probe: Probe) -> str:
        return (f"{probe.path} holds no {HUB_CONFIG} a hub reader knows beside one of "
                f"{', '.join(WEIGHTS)}")

    def _parts(self, path: Path, given: Config | None) -> tuple[Config, Path, Detection]:
        hub = _hub(path)
        if hub is None:
            raise CheckpointError(self.rejection(Probe(path)))
        cfg, reader, weights = hub
        config = reader.config(cfg, path)
        if given is not None and given != config:
            raise CheckpointError(
                f"{path / HUB_CONFIG} describes {config.arch} {config.to_json()}, but "
                f"--arch/--config gave {given.arch} {given.to_json()}; drop --arch/--config")
        return config, weights, _detect_file(weights)

    def read(self, path: Path, det: Detection, given: Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        config, weights, wdet = self._parts(path, given)
        ck = for_detection(wdet).read(weights, wdet, config, progress)
        said = f"config from {path / HUB_CONFIG}: {config.arch} {config.to_json()}"
        ck.notes = (said, *ck.notes)
        return ck

    def read_tree(self, path: Path, weights: str | None = None) -> ForeignTree:
        _, file, wdet = self._parts(path, None)
        return for_detection(wdet).read_tree(file, weights)

    def write(self, ck: Checkpoint, data: Path) -> None:
        raise CheckpointError("hub folders are read, not written")

    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        _, weights, wdet = self._parts(path, None)
        return for_detection(wdet).entries(weights, wdet, ck)
