"""The `HubReader` of timm's hub folders (`converters.adapters.hub`).

timm's ``config.json`` (``timm.models.push_to_hf_hub`` / ``save_for_hf``) maps as follows:

- ``architecture``: a model name `zoo.names` knows (``resnet18``, ``vit_small_patch16_224``);
- ``num_classes`` (top level, ``model_args`` or ``pretrained_cfg``): ``num_classes``;
- ``model_args.in_chans`` and the channels of ``pretrained_cfg.input_size``: ``in_channels``;
- the height and width of ``pretrained_cfg.input_size`` or ``model_args.img_size``: the
  config's spatial size field (``input_size`` or ``image_size``);
- other ``model_args`` and ``global_pool``: the config field of the same name; one the zoo
  config lacks is accepted only at the zoo's fixed behaviour (``global_pool: "avg"`` for a
  ResNet), else refused by name; ``drop_rate`` / ``drop_path_rate`` (training only) ignored;
- ``num_features`` (derived) and the rest of ``pretrained_cfg`` (preprocessing: mean, std,
  crop, interpolation, license, ...) do not change the model and are ignored.

Any other top-level field is refused by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.hub import HubReader
from zoo.configs import CONFIGS, Config, ConfigError, config_from_dict
from zoo.names import resolve

_TRAINING_ONLY = ("drop_rate", "drop_path_rate", "proj_drop_rate", "attn_drop_rate",
                  "pos_drop_rate", "patch_drop_rate")
_ZOO_FIXED = {"global_pool": "avg"}  # what a zoo model without the field always does
_SPATIAL = ("input_size", "image_size")  # the config field holding (height, width)
_TOP = ("architecture", "num_classes", "num_features", "global_pool", "model_args",
        "pretrained_cfg")


class TimmReader(HubReader):
    """timm's ``config.json`` (see the module doc for the mapping): any architecture
    `zoo.names` knows, in the zoo's own key layout; read only."""

    name: ClassVar[str] = "timm"

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
        spatial = next((f for f in _SPATIAL if f in fields), None)
        values: dict[str, Any] = dict(named)
        pretrained = cfg.get("pretrained_cfg") or {}
        if "input_size" in pretrained:
            c, *hw = pretrained["input_size"]
            values["in_channels"] = c
            if spatial is not None:
                values[spatial] = tuple(hw)
        args = dict(cfg.get("model_args") or {})
        for key in ("num_classes", "global_pool"):
            if key in cfg:
                args.setdefault(key, cfg[key])
        for key, value in args.items():
            target = {"in_chans": "in_channels", "img_size": spatial}.get(key, key)
            if key in _TRAINING_ONLY:
                continue
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

