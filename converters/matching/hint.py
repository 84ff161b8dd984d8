"""Which named model (`zoo.names`) a checkpoint fits, asked only when a conversion failed on
its keys or shapes: the layers' kinds and shapes compared, as multisets, with the schemas of
the named configs of the same architecture (abstract skeletons, cached by `zoo.registry.schema`;
no model is built)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from converters.matching.sources import SourceLayer
from zoo.configs import Config
from zoo.names import named_config, named_models
from zoo.registry import schema


def _target_sigs(config: Config) -> Counter:
    found, spec = schema(config)
    out: Counter = Counter()
    for layer in found:
        prefix = layer.name + "."
        shapes = {k[len(prefix):]: tuple(v.shape) for k, v in spec.items()
                  if k.startswith(prefix)}
        if layer.name in spec:
            shapes = {"": tuple(spec[layer.name].shape)}
        out[(layer.kind, tuple(sorted(shapes.items())))] += 1
    return out


def fits(sources: Sequence[SourceLayer], config: Config) -> bool:
    """Whether `config`'s layers have exactly the kinds and shapes of `sources`."""
    want = _target_sigs(config)
    got: Counter = Counter()
    for s in sources:
        for kind in s.kinds:
            shapes = s.shapes(kind)
            sig = (kind, tuple(sorted(shapes.items()))) if shapes is not None else None
            if sig in want:
                got[sig] += 1
                break
        else:
            return False
    return got == want


def _overrides(config: Config, base: Config) -> dict[str, Any]:
    """The fields `config` sets beyond `base` (what `--config` changed)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if getattr(config, f.name) != getattr(base, f.name)}


def fitting_names(sources: Sequence[SourceLayer], config: Config,
                  base: Config | None = None) -> list[str]:
    """The named models of `config`'s architecture that `sources` fit, `config` itself
    excluded; the fields `config` sets beyond `base` (default: the architecture's default
    config) are kept, the named model's own overrides win. Names giving the same config are
    named once."""
    given = _overrides(config, base if base is not None else type(config)())
    out, seen = [], set()
    for name, (arch, named) in named_models().items():
        if arch != config.arch:
            continue
        try:
            candidate = named_config(name, **{k: v for k, v in given.items()
                                              if k not in named})
        except (ValueError, TypeError):
            continue
        if candidate != config and candidate not in seen and fits(sources, candidate):
            out.append(name)  # the first name of a config (resnet18, not resnet18-flax
            seen.add(candidate)  # when --config gives its padding)
    return out


def hint(sources: Sequence[SourceLayer], config: Config, base: Config | None = None) -> str:
    """One line naming the models the source fits ("" if none)."""
    names = fitting_names(sources, config, base)
    return f"hint: the file fits {' or '.join(f'--arch {n}' for n in names)}" if names else ""
