"""The `HubReader` of timm's hub folders (`converters.adapters.config_readers`).

timm's ``config.json`` (``timm.models.push_to_hf_hub`` / ``save_for_hf``) maps as follows:

- ``architecture``: a model name `zoo.names` knows (``resnet18``, ``vit_small_patch16_224``);
- ``num_classes`` (top level, ``model_args`` or ``pretrained_cfg``): ``num_classes``;
- ``model_args.in_chans`` and the channels of ``pretrained_cfg.input_size``: ``in_channels``;
- the height and width of ``pretrained_cfg.input_size`` or ``model_args.img_size``: the
  config's spatial size field (``input_size`` or ``image_size``);
- other ``model_args`` and ``global_pool``: the config field of the same name, or the one
  the config's `TIMM_ARGS` gives (``embed_dim`` is a ViT's ``width``); one the zoo config
  lacks is accepted only at the zoo's fixed behaviour (``global_pool: "avg"`` for a ResNet),
  else refused by name; ``drop_rate`` / ``drop_path_rate`` (training only) ignored;
- ``num_features`` (derived), ``label_names`` / ``label_descriptions`` and the rest of
  ``pretrained_cfg`` (preprocessing: mean, std, crop, interpolation, license, ...) do not
  change the model and are ignored.

Any other top-level field is refused by name, and so is a field of the wrong type
(``pretrained_cfg`` that is no object, an ``input_size`` that is no list of integers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.config_readers import HubReader
from zoo.configs import CONFIGS, Config, ConfigError, config_from_dict
from zoo.names import resolve
from zoo.weights.pretrained.table import SPATIAL_FIELDS

_TRAINING_ONLY = ("drop_rate", "drop_path_rate", "proj_drop_rate", "attn_drop_rate",
                  "pos_drop_rate", "patch_drop_rate")
_ZOO_FIXED = {"global_pool": "avg"}  # what a zoo model without the field always does
_TOP = ("architecture", "num_classes", "num_features", "global_pool", "model_args",
        "pretrained_cfg", "label_names", "label_descriptions")


def _field(cfg: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    """`cfg[key]` (None when absent) if it is of `kind` (an int is no bool); ConfigError
    naming it otherwise."""
    value = cfg.get(key)
    if value is not None and (not isinstance(value, kind) or
                              (kind is int and isinstance(value, bool))):
        raise ConfigError(f"{where}: {key} must be {_KINDS.get(kind, kind.__name__)}, found "
                          f"{type(value).__name__}")
    return value


_KINDS = {dict: "an object", int: "an integer", str: "a string", list: "a list"}


def _sizes(value: Any, where: str, key: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ConfigError(f"{where}: {key} must be a list of positive integers, found "
                          f"{str(value)[:60]}")
    return value


class TimmReader(HubReader):
    """timm's ``config.json`` (see the module doc for the mapping): any architecture
    `zoo.names` knows, in the zoo's own key layout; read only."""

    name: ClassVar[str] = "timm"
    claims_what: ClassVar[str] = "timm's 'architecture' field"

    def claims(self, cfg: Mapping[str, Any]) -> bool:
        return isinstance(cfg.get("architecture"), str)

    def config(self, cfg: Mapping[str, Any], where: str) -> Config:
        unknown = [k for k in cfg if k not in _TOP]
        if unknown:
            raise ConfigError(f"{where}: field {unknown[0]!r} is not one a timm config.json "
                                  f"maps to the zoo (known: {', '.join(_TOP)})")
        try:
            arch, named = resolve(cfg["architecture"])
        except ConfigError as e:
            raise ConfigError(f"{where}: architecture: {e}") from e
        fields = {f.name for f in dataclasses.fields(CONFIGS[arch])}
        spatial = next((f for f in SPATIAL_FIELDS if f in fields), None)
        values: dict[str, Any] = dict(named)
        pretrained = _field(cfg, "pretrained_cfg", dict, where) or {}
        if pretrained.get("input_size") is not None:
            c, *hw = _sizes(pretrained["input_size"], where, "pretrained_cfg.input_size")
            values["in_channels"] = c
            if spatial is not None:
                values[spatial] = tuple(hw)
        args = dict(_field(cfg, "model_args", dict, where) or {})
        _field(cfg, "num_classes", int, where)
        for key in ("num_classes", "global_pool"):
            if key in cfg:
                args.setdefault(key, cfg[key])
        if args.get("num_classes") == 0:  # features only: no classifier in the weights (the
            del args["num_classes"]  # config keeps its own; loading adds a new one from seed)
        renamed = {"in_chans": "in_channels", "img_size": spatial,
                   **CONFIGS[arch].TIMM_ARGS}
        for key, value in args.items():
            target = renamed.get(key, key)
            if key in _TRAINING_ONLY or (key in renamed and target is None):
                continue  # no effect on the models the zoo's config describes
            if key == "img_size" and isinstance(value, int):
                value = (value, value)
            if target in fields:
                values[target] = tuple(value) if isinstance(value, list) else value
            elif _ZOO_FIXED.get(key, object()) != value:
                raise ConfigError(f"{where}: model_args.{key}={value!r} has no counterpart "
                                      f"in the zoo's {arch} config")
        try:
            return config_from_dict({**values, "arch": arch})
        except (ConfigError, TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from e

