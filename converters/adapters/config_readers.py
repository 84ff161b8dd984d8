"""Hub folders (`config.json` beside `model.safetensors`, a sharded safetensors index or
`pytorch_model.bin`): one `HubReader` per family (HF transformers' ViT, timm, ...) reads its
`config.json` into a zoo config, names the layout adapter of its weights and, for a family
that has one zoo architecture, writes the `config.json` of a zoo config back. A family is added
with `register`; the first registered reader that claims a `config.json` reads it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.adapter import Adapter
from zoo.configs import Config, ConfigError
from zoo.weights.sources import CONFIG, WEIGHTS

__all__ = ["CONFIG", "WEIGHTS", "HubReader", "ModelTypeReader", "reader_for", "readers",
           "register", "writer_for"]


class HubReader(ABC):
    """The `config.json` of one model family."""

    name: ClassVar[str]
    model_type: ClassVar[str | None] = None  # transformers' `model_type` it claims, if any
    arch: ClassVar[str | None] = None  # the one zoo architecture it writes (None: read only)
    adapter: ClassVar[Adapter | None] = None  # the layout of its weights (None: the zoo's)
    claims_what: ClassVar[str] = ""  # what it claims, in words ("model_type 'vit'")
    writes_any: ClassVar[bool] = False  # writes every architecture no other family writes

    @abstractmethod
    def claims(self, raw: Mapping[str, Any]) -> bool:
        """Whether `raw` (a parsed `config.json`) is this family's."""

    @abstractmethod
    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        """The zoo config of `raw`; ConfigError naming the field (and `where`) otherwise."""

    def writes(self, config: Config) -> bool:
        """Whether this family writes the `config.json` of `config` (default: a config of its
        one architecture; a family of several `model_type`s looks at the config)."""
        return self.arch is not None and self.arch == config.arch

    def hub_config(self, config: Config) -> dict[str, Any]:
        """The `config.json` of a zoo `config` (the family's own field names); a family that
        is only read (no `arch`) refuses."""
        raise ConfigError(f"{self.name} config.json files are read, not written "
                          f"(a {config.arch})")


class ModelTypeReader(HubReader):
    """The `config.json` of one transformers `model_type`, named after it: it claims the
    files of that `model_type` and writes its architecture's configs of that `model_type`
    (every one, where the config has no such field)."""

    model_type: ClassVar[str]

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.model_type

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return raw.get("model_type") == self.model_type

    def writes(self, config: Config) -> bool:
        return super().writes(config) and getattr(
            config, "model_type", self.model_type) == self.model_type


_READERS: list[HubReader] = []


def register(reader: HubReader) -> HubReader:
    if any(r.name == reader.name for r in _READERS):
        raise ValueError(f"a hub reader {reader.name!r} is registered already")
    _READERS.append(reader)
    return reader


def reader_for(raw: Mapping[str, Any]) -> HubReader | None:
    """The reader that claims a parsed `config.json`, if any."""
    return next((r for r in _READERS if r.claims(raw)), None)


def writer_for(config: Config) -> HubReader | None:
    """The reader that writes `config.json` for `config`: its family's (`HubReader.writes`),
    else one that writes any (the zoo's own), if any."""
    return next((r for r in _READERS if r.writes(config)),
                next((r for r in _READERS if r.writes_any), None))


def config_json(config: Config) -> dict[str, Any]:
    """The `config.json` of a zoo `config`, as its family's writer writes it (a ConfigError
    when no family writes it)."""
    writer = writer_for(config)
    if writer is None:
        raise ConfigError(f"no Hugging Face family writes a {config.arch} config.json")
    return writer.hub_config(config)


def readers() -> tuple[HubReader, ...]:
    return tuple(_READERS)
