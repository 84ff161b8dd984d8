"""A file of a model's backbone alone, read as the model: one rule for every family, declared
by the config (`Config.backbone_prefix`, `Config.HEADLESS`), never by the family's name.

transformers' base models (`GPT2Model`, `LlamaModel`, `BertModel`, `RobertaModel`) save the
body's keys without the prefix their heads' models put before them (`transformer.`, `model.`,
`bert.`, `roberta.`); timm's headless models (`num_classes=0`) and HF's `ViTModel` (through its
layout adapter) save every key but the head's. Such a file is the model without its head:

- keys that equal the model's under `backbone_prefix` take the prefix (`as_backbone`); a head
  tied to the embedding is then whole, an untied head (`lm_head.weight`) is left at its
  canonical initialisation (`canonical_init`, seed 0), and a note says which;
- a config with a headless form (`HEADLESS`) is not filled: the refusal names that form as
  the fix in one line (`headless_fix`: "pass --num-classes 0").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from converters.core import canonical_spec
from zoo.configs import Config
from zoo.weights.init import canonical_init

# the config fields the command line sets by an option of their own
OPTIONS = {"num_classes": "--num-classes"}


def as_backbone(state: Mapping[str, Any], config: Config
                ) -> tuple[dict[str, Any], list[str]] | None:
    """`state` under the model's keys when its keys are the backbone's without
    `config.backbone_prefix` (None otherwise, and when the config has a headless form the
    file's head-less keys call for: `headless_fix` names it): the prefix added, an untied head
    drawn from the canonical initialisation; one note per fact."""
    if not _unprefixed(state, config):
        return None
    prefix, spec = config.backbone_prefix, canonical_spec(config)
    out = {prefix + k: v for k, v in state.items()}
    if set(out) != {k for k in spec if k.startswith(prefix)}:
        return None
    head = [k for k in spec if k not in out]
    if head and config.headless() is not None:
        return None
    notes = [f"the keys lack the prefix {prefix!r}: a file of {config.arch}'s backbone "
             "(transformers' base model), read under the prefix; checked: every key and "
             "shape then fits; not checked: the outputs against the source model"]
    if config.ties and not head:
        sources = ", ".join(t.source for t in config.ties)
        notes.append(f"head: tied to the embedding ({sources}): the whole {config.arch}")
    elif head:
        dtype = next((v.dtype for v in out.values() if getattr(v, "dtype", None) is not None
                      and v.dtype.kind == "f"), "float32")
        out.update(canonical_init(config, 0, dtype, only=head))
        notes.append(f"head: {_listed(head)} not in the file: left at its initialisation "
                     "(seed 0); the hidden states (encode) are the file's, the head's output "
                     "is not")
    else:
        notes.append("head: none in the model")
    return out, notes


def refusal_line(state: Mapping[str, Any], config: Config) -> str:
    """One line naming the fix for a file of `config`'s backbone that does not load as it is
    ("" when `state` is not one): the headless form to ask for, or the missing prefix."""
    return headless_fix(state, config) or _prefix_hint(state, config)


def headless_fix(state: Mapping[str, Any], config: Config) -> str:
    """The line naming the option of the headless form when `state` holds `config`'s model
    without its head ("" otherwise)."""
    headless = config.headless()
    if headless is None:
        return ""
    spec, bare = canonical_spec(config), canonical_spec(headless)
    lacks = _unprefixed(state, config)
    keys = {config.backbone_prefix + k for k in state} if lacks else set(state)
    if keys != set(bare) or set(bare) >= set(spec):
        return ""
    head = [k for k in spec if k not in bare]
    said = (f"the keys lack the prefix {config.backbone_prefix!r} and the head" if lacks
            else "the file has no head")
    return (f"{said} ({_listed(head)}): a file of {config.arch}'s backbone (the model "
            f"without its head); pass {_option(config)} to read it as that model")


def _prefix_hint(state: Mapping[str, Any], config: Config) -> str:
    """The line saying the keys lack the backbone's prefix, when most of them fit under it."""
    if not _unprefixed(state, config):
        return ""
    spec = canonical_spec(config)
    under = sum(config.backbone_prefix + k in spec for k in state)
    if under * 2 <= len(state):
        return ""
    return (f"the keys lack the prefix {config.backbone_prefix!r}: a file of {config.arch}'s "
            "backbone (transformers' base model); under the prefix they still do not fit "
            "the config (below): check --arch / --config")


def _unprefixed(state: Mapping[str, Any], config: Config) -> bool:
    prefix = config.backbone_prefix
    return bool(prefix and state) and not any(k.startswith(prefix) for k in state)


def _listed(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def _option(config: Config) -> str:
    """How a command line asks for the headless form: an option of its own, else --config."""
    overrides = dict(config.HEADLESS)
    python = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
    if set(overrides) <= set(OPTIONS):
        flags = " ".join(f"{OPTIONS[k]} {v}" for k, v in overrides.items())
        return f"{flags} (in Python, a config with {python})"
    text = json.dumps(overrides, sort_keys=True)[1:-1]
    return f"{text} in --config (in Python, a config with {python})"
