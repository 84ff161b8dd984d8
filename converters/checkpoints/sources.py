"""Sources wherever a checkpoint path is accepted: ``hf-hub:ORG/REPO[@REVISION]`` and
``local-dir:PATH`` (`zoo.weights.sources.Source`) become the local folder that holds them, fetched
through ``huggingface_hub``'s cache and checked there (`zoo.weights.sources`). A folder's
``config.json`` decides its reader (`converters.adapters.config_readers`: timm, transformers'
families, the zoo's own); one that no reader claims is refused in one line naming what it is."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from converters.adapters import config_readers
from converters.checkpoints.io import CheckpointError, UsageError
from zoo.configs import Config, ConfigError
from zoo.weights.sources import CONFIG, BadSourceError, Source, SourceError, read_json


def kind_of(raw: Mapping[str, Any]) -> str:
    """What a ``config.json`` is, in words, from its telling fields."""
    if isinstance(raw.get("model_type"), str):
        arch = raw.get("architectures")
        named = f" ({arch[0]})" if isinstance(arch, list) and arch and isinstance(
            arch[0], str) else ""
        return f"a transformers config of model_type {raw['model_type']!r}{named}"
    if "architecture" in raw:
        return f"a timm config of architecture {raw['architecture']!r}"
    if "_class_name" in raw:
        return f"a diffusers config of {raw['_class_name']!r}"
    if "arch" in raw:
        return f"a config of architecture {raw['arch']!r}"
    keys = ", ".join(list(map(str, raw))[:6]) or "no fields"
    return f"a config.json of no known kind (fields: {keys})"


def readers_line() -> str:
    return "; ".join(f"{r.name} ({r.claims_what})" for r in config_readers.readers())


def check_kind(folder: Path, where: str) -> dict[str, Any] | None:
    """The folder's parsed ``config.json`` (None without one); CheckpointError in one line when
    it is too large, too deep, not an object, or of a kind no hub reader reads."""
    path = folder / CONFIG
    if not path.is_file():
        return None
    try:
        raw = read_json(path, f"{where}: {CONFIG}")
    except SourceError as e:
        raise CheckpointError(str(e)) from e
    if config_readers.reader_for(raw) is None:
        raise CheckpointError(f"{where}: {CONFIG} is {kind_of(raw)}, which no zoo reader "
                              f"reads (readers: {readers_line()})")
    return raw


def local(src: str | os.PathLike | Source, *, weights: bool = True) -> Path:
    """The local path of a checkpoint source: a plain path as it is; a ``hf-hub:`` or
    ``local-dir:`` source as its folder (fetched into the Hugging Face cache and checked, its
    ``config.json`` of a kind a reader reads)."""
    try:
        source = Source.parse(src if isinstance(src, Source) else os.fspath(src))
        if source is None:
            return Path(src)
        folder = source.folder(weights=weights)
    except BadSourceError as e:
        raise UsageError(str(e)) from e
    except SourceError as e:
        raise CheckpointError(str(e)) from e
    check_kind(folder, str(source))
    return folder


def source_config(src: str | Source) -> Config:
    """The zoo config a source's ``config.json`` describes (only that file is fetched)."""
    source = Source.parse(src)
    if source is None:
        raise UsageError(f"{src}: not a source (hf-hub:ORG/REPO or local-dir:PATH)")
    folder = local(source, weights=False)
    raw = check_kind(folder, str(source))
    if raw is None:
        raise CheckpointError(f"{source}: no {CONFIG}: give the architecture (the name of a "
                              "model) and pass the source as weights=")
    reader = config_readers.reader_for(raw)
    try:
        return reader.config(raw, f"{source}: {CONFIG}")
    except ConfigError as e:
        raise CheckpointError(str(e)) from e
