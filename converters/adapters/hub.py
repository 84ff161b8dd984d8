"""Hub folders (`config.json` beside `model.safetensors`): one `HubReader` per family reads its
`config.json` into a zoo config, names the layout adapter of its weights, and writes the
`config.json` of a zoo config back. A family is added with `register`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.base import Adapter
from zoo.configs import Config

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


class HubReader(ABC):
    """The `config.json` of one model family."""

    name: ClassVar[str]
    arch: ClassVar[str]  # the zoo architecture its configs become
    adapter: ClassVar[Adapter | None] = None  # the layout of its weights (None: the zoo's)

    @abstractmethod
    def claims(self, raw: Mapping[str, Any]) -> bool:
        """Whether `raw` (a parsed `config.json`) is this family's."""

    @abstractmethod
    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        """The zoo config of `raw`; ConfigError naming the field (and `where`) otherwise."""

    @abstractmethod
    def hub_config(self, config: Config) -> dict[str, Any]:
        """The `config.json` of a zoo `config` (the family's own field names)."""


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
    """A reader that writes `config.json` for `config`'s architecture, if any."""
    return next((r for r in _READERS if r.arch == config.arch), None)


def readers() -> tuple[HubReader, ...]:
    return tuple(_READERS)
