"""The zoo's own ``config.json`` (`converters.adapters.config_readers`): a hub folder of any
architecture, written by ``--to hub`` where no family writes that architecture, the weights in
the canonical (PyTorch `state_dict`) names:

    {"zoo_checkpoint": 1, "library": "jax-model-zoo", "arch": "resnet", "config": {...}}

The config is read field by field as every zoo config is (`config_from_dict`); a newer format
version is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.config_readers import HubReader
from converters.checkpoints.io import FORMAT_VERSION, SIDECAR_MARKER
from zoo.configs import Config, ConfigError, config_from_dict

LIBRARY = "jax-model-zoo"


class ZooReader(HubReader):
    """A ``config.json`` carrying the zoo's marker and config: every architecture."""

    name: ClassVar[str] = "zoo"
    writes_any: ClassVar[bool] = True
    claims_what: ClassVar[str] = f"the zoo's own '{SIDECAR_MARKER}' marker"

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return SIDECAR_MARKER in raw and isinstance(raw.get("config"), dict)

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        version = raw[SIDECAR_MARKER]
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ConfigError(f"{where}: {SIDECAR_MARKER} must be a format version, found "
                              f"{version!r}")
        if version > FORMAT_VERSION:
            raise ConfigError(f"{where}: written by a newer jax-model-zoo (format {version}; "
                              f"this version reads {FORMAT_VERSION})")
        unknown = sorted(set(raw) - {SIDECAR_MARKER, "library", "arch", "config"})
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
        data = dict(raw["config"])
        if "arch" in raw and data.setdefault("arch", raw["arch"]) != raw["arch"]:
            raise ConfigError(f"{where}: arch {raw['arch']!r} but the config's is "
                              f"{data['arch']!r}")
        try:
            return config_from_dict(data)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from e

    def hub_config(self, config: Config) -> dict[str, Any]:
        return {SIDECAR_MARKER: FORMAT_VERSION, "library": LIBRARY, "arch": config.arch,
                "config": config.to_dict()}
