"""Hub folders: `config.json` (read by a `converters.adapters.hub` reader: HF transformers,
timm, ...) beside `model.safetensors` in the family's own key layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from safetensors.numpy import save_file

from converters.adapters import hub
from converters.checkpoints.base import Checkpoint, Detection, ordered_state
from converters.checkpoints.format import CheckpointFormat, Entry, Probe
from converters.checkpoints.formats.safetensors import TorchSafetensors, read_header
from converters.checkpoints.io import CheckpointError, ProgressFn
from zoo.configs import Config, ConfigError


def _hub_json(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The parsed `config.json` of a folder, or None and why it is no hub folder."""
    config = path / hub.CONFIG
    if not config.is_file():
        return None, f"no {hub.CONFIG}"
    if not (path / hub.WEIGHTS).is_file():
        return None, f"{hub.CONFIG} but no {hub.WEIGHTS}"
    try:
        raw = json.loads(config.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{config}: not a readable JSON file ({type(e).__name__})") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{config}: must be a JSON object, found {type(raw).__name__}")
    return raw, ""


class HubFolder(CheckpointFormat):
    """``hub``: a model folder as the Hugging Face Hub stores it (`config.json` and
    `model.safetensors`), read and written through the family's hub reader and layout."""

    name: ClassVar[str] = "hub"
    directory: ClassVar[bool] = True
    holds_any: ClassVar[bool] = False  # the families with a hub reader, model weights only
    carries_config: ClassVar[bool] = True

    def _raw(self, probe: Probe) -> tuple[dict[str, Any] | None, str]:
        return probe.fact("hub", _hub_json)

    def detect(self, probe: Probe) -> Detection | None:
        raw, _ = self._raw(probe)
        reader = None if raw is None else hub.reader_for(raw)
        if reader is None:
            return None
        return self.detection(f"{hub.CONFIG} of the {reader.name} family and {hub.WEIGHTS}")

    def rejection(self, probe: Probe) -> str:
        raw, why = self._raw(probe)
        if raw is None:
            return f"not a hub folder ({why})"
        return (f"not a hub folder of a known family ({hub.CONFIG} with model_type "
                f"{raw.get('model_type')!r}, architecture {raw.get('architecture')!r}; known: "
                f"{[r.name for r in hub.readers()]})")

    def read(self, path: Path, det: Detection, given: Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        raw, _ = _hub_json(path)
        reader = hub.reader_for(raw or {})
        if raw is None or reader is None:
            raise CheckpointError(f"{path}: no longer a hub folder of a known family")
        try:
            config = reader.config(raw, str(path / hub.CONFIG))
        except ConfigError as e:
            raise CheckpointError(str(e)) from e
        if given is not None and given != config:
            raise CheckpointError(
                f"{path / hub.CONFIG} gives {config.arch} {config.to_json()}, but --arch/--config "
                f"gave {given.arch} {given.to_json()}; drop --arch/--config to use the folder's")
        weights = path / hub.WEIGHTS
        if read_header(weights)[0] is None:
            raise CheckpointError(f"{weights}: not a valid safetensors file "
                                  f"({read_header(weights)[1]})")
        return TorchSafetensors().read(weights, det, config, progress)

    def refuse(self, ck: Checkpoint) -> None:
        if ck.training:
            raise CheckpointError("a hub folder holds model weights only: pass --model-only")
        if hub.writer_for(ck.config) is None:
            raise CheckpointError(f"no hub family writes a {ck.config.arch}; families: "
                                  f"{[r.name for r in hub.readers()]}")

    def write(self, ck: Checkpoint, data: Path) -> None:
        reader = hub.writer_for(ck.config)
        if reader is None:  # refused before staging (`refuse`)
            raise CheckpointError(f"no hub family writes a {ck.config.arch}")
        hub_config = reader.hub_config(ck.config)
        state = ordered_state(ck)
        if reader.adapter is not None:
            state = reader.adapter.from_zoo(state)
        data.mkdir()
        (data / hub.CONFIG).write_text(json.dumps(hub_config, indent=2) + "\n")
        save_file({k: v.copy(order="C") for k, v in state.items()}, str(data / hub.WEIGHTS),
                  metadata={"format": "pt"})

    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        return TorchSafetensors().entries(path / hub.WEIGHTS, det, ck)
