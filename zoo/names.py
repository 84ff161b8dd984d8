"""Named models: torchvision / timm names ("resnet50", "vit_small_patch16_224") for configs.

Each architecture's config class declares its names in `NAMED` (name -> config overrides); an
architecture's own name ("resnet") stands for its default config. Every place that asks for a
config by name (`zoo.make_config`, `zoo.create`, the converters' `--arch`) resolves it here; an
unknown name is refused in one line that suggests the closest known ones.

A name may carry a pretrained tag, as timm's do (``resnet50.a1_in1k``, `zoo.weights.pretrained`):
the tag sets the config fields timm's pretrained config sets (the class count, the input size and
channels); an unknown tag of a known name is refused naming its tags.
"""

from __future__ import annotations

import difflib
import fnmatch
from typing import Any

from zoo.configs import CONFIGS, Config, ConfigError
from zoo.configs import named_models as named_models  # re-exported: names live here
from zoo.weights.pretrained.table import find, split


def resolve(name: str) -> tuple[str, dict[str, Any]]:
    """(architecture, config overrides) of an architecture name or a named model."""
    if name in CONFIGS:
        return name, {}
    table = named_models()
    if name in table:
        return table[name]
    base, tag = split(str(name), {**table, **dict.fromkeys(CONFIGS)})
    if tag is not None:  # an architecture's own name stands for its default config
        arch, overrides = table.get(base, (base, {}))
        return arch, {**overrides, **find(base, tag).overrides(CONFIGS[arch])}
    close = difflib.get_close_matches(str(name), [*CONFIGS, *table], n=3)
    hint = (f"did you mean {' or '.join(map(repr, close))}?" if close
            else "zoo.list_models() lists the known names")
    raise ConfigError(f"unknown model {name!r}: {hint}")


def named_config(name: str, **overrides: Any) -> Config:
    """The config of an architecture or named model, with `overrides` applied on top."""
    arch, named = resolve(name)
    return CONFIGS[arch](**{**named, **overrides})


def make_config(arch: str | Config, **overrides: Any) -> Config:
    """A config from an architecture or model name ("resnet50", `zoo.names`) plus overrides,
    or an existing config."""
    if isinstance(arch, Config):
        if overrides:
            raise ConfigError("pass overrides with an architecture name, not with a config")
        return arch
    return named_config(arch, **overrides)


def list_models(pattern: str = "*") -> list[str]:
    """The names `zoo.create` accepts (architectures and named models) matching the shell-style
    `pattern` (`fnmatch`, as timm's `list_models`), sorted."""
    return sorted(n for n in {*CONFIGS, *named_models()} if fnmatch.fnmatchcase(n, pattern))
