"""Weights for `zoo.create(..., weights=...)`: a canonical state or a checkpoint file, adapted to
the requested config by the architecture's `ADAPTERS` (`zoo.weights.adaptation`).

Files are read by the checkpoint formats of the `converters` package, which registers its reader
here when imported (the zoo does not import the converters at module level: a call that needs
the reader imports the package named by `READERS_PACKAGE`, as the registry imports a model
class given as "module:Class"). `weights` may be a source (``hf-hub:ORG/REPO[@REVISION]``,
``local-dir:PATH``, `zoo.weights.sources`): the converters fetch and check it.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import canonical
from zoo.configs import Config, ConfigError
from zoo.registry import schema
from zoo.weights.adaptation import Adapter, Arrays
from zoo.weights.init import canonical_init

# path, config -> the file's canonical arrays as stored (not validated against the config)
Reader = Callable[[str | os.PathLike, Config], Mapping[str, Any]]
# a source ("hf-hub:ORG/REPO") -> the zoo config its config.json describes
ConfigReader = Callable[[str], Config]
# a zoo config -> the `config.json` of its Hugging Face family (transformers' fields)
ConfigWriter = Callable[[Config], dict[str, Any]]
_READERS: list[Reader] = []
_CONFIG_READERS: list[ConfigReader] = []
_CONFIG_WRITERS: list[ConfigWriter] = []
READERS_PACKAGE = "converters"  # registers its readers when imported


def register_reader(reader: Reader, config_reader: ConfigReader | None = None,
                    config_writer: ConfigWriter | None = None) -> None:
    """Set how `zoo.create(weights=PATH)` reads a file and, with `config_reader`, how a source
    named as a model (``zoo.create("hf-hub:ORG/REPO", ...)``) gives its config, with
    `config_writer` how a config is written as a ``config.json`` (the converters register
    theirs)."""
    _READERS[:] = [reader]
    if config_reader is not None:
        _CONFIG_READERS[:] = [config_reader]
    if config_writer is not None:
        _CONFIG_WRITERS[:] = [config_writer]


def _registered(readers: list[Any], what: str) -> Any:
    if not readers:
        try:
            importlib.import_module(READERS_PACKAGE)
        except ImportError as e:
            raise RuntimeError(f"{what} needs the {READERS_PACKAGE} package ({e})") from e
    if not readers:
        raise RuntimeError(f"{what}: {READERS_PACKAGE} registered no reader")
    return readers[0]


def hub_config(config: Config) -> dict[str, Any]:
    """The ``config.json`` a Hugging Face folder of `config` holds (transformers' fields: the
    benchmark builds `transformers`' model of a zoo config from it)."""
    return _registered(_CONFIG_WRITERS, f"writing the config.json of a {config.arch}")(config)


def source_config(source: str) -> Config:
    """The zoo config a source's ``config.json`` describes (``hf-hub:timm/resnet50.a1_in1k``)."""
    return _registered(_CONFIG_READERS, f"reading the config of {source}")(source)


def adapt(state: Mapping[str, Any], config: Config, seed: int = 0) -> tuple[Arrays, list[str]]:
    """`state` (a canonical state of `config`'s architecture, possibly of another class count,
    image size or input channels) adapted to `config` by the architecture's `ADAPTERS`; the
    arrays of a re-initialised part come from `canonical_init(config, seed)`. Returns the new
    state (the caller's is not changed) and one line per adaptation. Shapes no adapter fixes
    are left for validation to name."""
    adapters: tuple[Adapter, ...] = type(config).ADAPTERS
    out = {k: np.asarray(v) for k, v in state.items()}
    if not adapters:
        return out, []
    floats = [v.dtype for v in out.values() if np.issubdtype(v.dtype, np.floating)]
    target = canonical_init(config, seed, floats[0] if floats else "float32")
    notes: list[str] = []
    for adapter in adapters:
        out, said = adapter(out, target, config)
        notes += said
    return out, notes


def load(weights: str | os.PathLike | Mapping[str, Any], config: Config, seed: int = 0
         ) -> Arrays:
    """The canonical state of `weights` (a path or a canonical state) adapted to `config`; each
    adaptation is reported as a `UserWarning`."""
    if isinstance(weights, Mapping):
        state = weights
    else:
        state = _registered(_READERS, f"weights={str(weights)!r}")(weights, config)
    state = canonical.untie(state, config.ties)  # transformers' lm_head.weight beside wte
    out, notes = adapt(state, config, seed)
    _check_fits(out, config, weights)
    for note in notes:
        warnings.warn(f"{config.arch} weights: {note}", UserWarning, stacklevel=3)
    return out


def _check_fits(state: Arrays, config: Config, weights: Any) -> None:
    """One line naming the keys of `state` that do not fit `config` after adaptation."""
    spec = schema(config)[1]
    where = "the state" if isinstance(weights, Mapping) else str(weights)
    problems = [f"missing {k!r}" for k in spec if k not in state]
    problems += [f"unexpected {k!r}" for k in state if k not in spec]
    problems += [f"{k!r} is {tuple(state[k].shape)}, expected {tuple(spec[k].shape)}"
                 for k in spec.keys() & state.keys()
                 if tuple(state[k].shape) != tuple(spec[k].shape)]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ConfigError(f"{where} does not fit {config.arch} {config.to_json()}: "
                          + "; ".join(sorted(problems)[:5]) + more)
