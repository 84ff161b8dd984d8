"""Which config a checkpoint holds: `--arch` / `--config` parsed, the stored one resolved."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from converters.checkpoints.io import CheckpointError
from converters.core import canonical_spec
from zoo.configs import CONFIGS, Config, ConfigError, config_from_dict
from zoo.names import resolve
from zoo.registry import ARCHS


def parse_config(arch: str | None = None, config: Any = None) -> Config | None:
    """A config from `--arch` and/or `--config` (a Config, a dict, a JSON string or file)."""
    if arch is None and config is None:
        return None
    if isinstance(config, Config):
        if arch is not None and arch != config.arch:
            raise ConfigError(f"--arch {arch!r} contradicts the config's arch {config.arch!r}")
        return config
    data: dict[str, Any] = {}
    if isinstance(config, Mapping):
        data = dict(config)
    elif config is not None:
        data = _json_object(str(config))
    if arch is not None:
        arch, named = resolve(arch)  # a model name ("resnet50"): its architecture and overrides
        if data.get("arch", arch) != arch:
            raise ConfigError(f"--arch {arch!r} contradicts the config's arch {data['arch']!r}")
        data = {**named, **data, "arch": arch}
    if "arch" not in data:
        raise ConfigError(f"the config names no architecture: pass --arch (one of {list(ARCHS)})")
    return config_from_dict(data)


def _json_object(text: str) -> dict[str, Any]:
    """The JSON object `--config` gives inline or in a file."""
    where = "--config"
    if not text.lstrip().startswith("{"):
        p = Path(text)
        if not p.is_file():
            raise ConfigError(f"--config {text!r}: neither a JSON object nor a file")
        where = f"--config file {p}"
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{where} is not UTF-8 text (binary?)") from e
        except OSError as e:
            raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from e
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise ConfigError(f"{where} is not valid JSON: {why}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a JSON object, found {type(data).__name__}")
    return data


def guess_arch(keys: list[str]) -> str:
    """A hint naming the architectures whose canonical keys equal `keys` ("" if none)."""
    hits = [a for a in ARCHS if set(canonical_spec(CONFIGS[a]())) == set(keys)]
    return f" (its keys are those of {' or '.join(map(repr, hits))})" if hits else ""


def resolve_config(path: Path, meta: dict[str, Any] | None, given: Config | None,
                   keys: list[str] | None = None) -> Config:
    """The config stored in `meta`, else `given`; both must agree when both exist."""
    stored = None
    if meta and meta.get("config") is not None:
        try:
            stored = config_from_dict(meta["config"])
        except (ConfigError, TypeError) as e:
            raise CheckpointError(f"{path}: the stored config is invalid: {e}") from e
    if stored is not None and given is not None and stored != given:
        raise CheckpointError(
            f"{path} says it holds {stored.arch} {stored.to_json()}, but --arch/--config gave "
            f"{given.arch} {given.to_json()}; drop --arch/--config to use the stored one")
    config = stored or given
    if config is None:
        hint = guess_arch(keys) if keys else ""
        raise CheckpointError(
            f"{path} carries no architecture or config{hint}: pass --arch (and --config if it "
            "is not the default)")
    return config
