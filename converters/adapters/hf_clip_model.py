"""transformers' two-tower `CLIPModel` and `SiglipModel`: their key layout (`HF_CLIP_MODEL`,
`HF_SIGLIP_MODEL`: the image tower's `vision_model.*` through the image-tower layouts of
`hf_clip`, under the zoo's `vision_model.`; the text tower, the projections and the logit
scale and bias under transformers' own names, the zoo's canonical ones) and `config.json`
(`model_type` "clip", "siglip": `text_config` and `vision_config`, read into the zoo's `clip`
config and written back).

CLIP's `text_config_dict` / `vision_config_dict` (files written by transformers 4.2x) are
read over `text_config` / `vision_config`, as transformers reads them. Fields the zoo does
not compute are refused by name (`refuse_fields`): cross-attention, an activation other than
QuickGELU, GELU or tanh GELU, SigLIP's image tower without its attention-pool head, any
unknown field.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.adapter import Adapter, Drop, Rename, Split
from converters.adapters.config_readers import HubReader, ModelTypeReader
from converters.adapters.hf_clip import HF_CLIP_VISION, HF_SIGLIP_VISION
from converters.adapters.hf_common import pair
from converters.adapters.hf_lm import build_config, must, refuse_fields
from zoo.configs import Config, ConfigError
from zoo.models.clip.config import ClipConfig

_V = "vision_model."
_TEXT = tuple(Rename(f"text_model.{t}", f"text_model.{t}") for t in (
    "embeddings.token_embedding.weight", "embeddings.position_embedding.weight",
    "encoder.layers.{i}.{r}", "final_layer_norm.{p}", "head.{p}"))
_BUFFERS = (Drop("{r}.position_ids", "position ids (a buffer derived from the size)"),)


def _under(rule: Any) -> Any:
    """An image-tower rule of `hf_clip` with the zoo's keys under `vision_model.`."""
    if isinstance(rule, Split):
        return dataclasses.replace(rule, parts=tuple(_V + p for p in rule.parts))
    return dataclasses.replace(rule, zoo=_V + rule.zoo)


def _two_tower(tower: Adapter, name: str, description: str, own: tuple[str, ...]) -> Adapter:
    """The two-tower layout over the image tower's `tower` layout: its rules under
    `vision_model.`, the text tower's, and the model's own arrays (`own`)."""
    return Adapter(
        name=name, description=description, arch="clip",
        groups=(("text_model.embeddings", "text embeddings (text_model.embeddings)"),
                *tower.groups),
        renames=(*(Rename(k, k) for k in own), *_TEXT, *map(_under, tower.renames)),
        fuses=tuple(map(_under, tower.fuses)), splits=tuple(map(_under, tower.splits)),
        drops=_BUFFERS)


HF_CLIP_MODEL = _two_tower(HF_CLIP_VISION, "hf-clip", "HF transformers CLIPModel",
                           ("logit_scale", "visual_projection.weight",
                            "text_projection.weight"))
HF_SIGLIP_MODEL = _two_tower(HF_SIGLIP_VISION, "hf-siglip", "HF transformers SiglipModel",
                             ("logit_scale", "logit_bias"))

_TEXT_FIELDS = {"vocab_size": "vocab_size", "hidden_size": "text_hidden_size",
                "intermediate_size": "text_intermediate_size",
                "num_hidden_layers": "text_num_hidden_layers",
                "num_attention_heads": "text_num_attention_heads",
                "hidden_act": "text_hidden_act", "layer_norm_eps": "text_layer_norm_eps",
                "max_position_embeddings": "max_position_embeddings",
                "eos_token_id": "eos_token_id"}
_VISION_FIELDS = {"hidden_size": "vision_hidden_size",
                  "intermediate_size": "vision_intermediate_size",
                  "num_hidden_layers": "vision_num_hidden_layers",
                  "num_attention_heads": "vision_num_attention_heads",
                  "hidden_act": "vision_hidden_act", "layer_norm_eps": "vision_layer_norm_eps",
                  "num_channels": "num_channels", "image_size": "image_size",
                  "patch_size": "patch_size"}
# fields of the towers' configs that change nothing the two-tower model computes: a tower's
# own projection width (read at the top level), dropout (training), initialisation, a tie
# of an LM head they have not
_TOWER_INERT = {"projection_dim", "attention_dropout", "dropout", "initializer_factor",
                "add_cross_attention", "typical_p", "projection_size", "tie_word_embeddings"}
_TOP = {"projection_dim", "logit_scale_init_value", "initializer_factor", "text_config",
        "vision_config", "text_config_dict", "vision_config_dict"}
_FIXED = {"add_cross_attention": (False,), "vision_use_head": (True,)}


class TwoTowerReader(ModelTypeReader):
    """`config.json` of one two-tower `model_type` (transformers' defaults for absent fields:
    the zoo's `ClipConfig` defaults are `CLIPConfig`'s, `defaults` the others'), read into
    and written from the zoo's `clip` config."""

    arch: ClassVar[str] = "clip"
    prefix: ClassVar[str]  # transformers' class names: "CLIP", "Siglip"
    defaults: ClassVar[dict[str, Any]]  # transformers' defaults that differ from the zoo's

    def _tower(self, raw: Mapping[str, Any], part: str, fields: dict[str, str],
               where: str) -> dict[str, Any]:
        tower = {**(raw.get(f"{part}_config") or {}), **(raw.get(f"{part}_config_dict") or {})}
        where = f"{where} ({part}_config)"
        family = f"{self.model_type} {part} tower"
        refuse_fields(tower, {*fields, *_TOWER_INERT, *_FIXED}, where, family)
        for field, allowed in _FIXED.items():
            must(tower, field, allowed, where, family)
        return {zoo: tower[hf] for hf, zoo in fields.items() if hf in tower}

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        refuse_fields(raw, _TOP, where, self.model_type)
        values = {**self.defaults, **self._tower(raw, "text", _TEXT_FIELDS, where),
                  **self._tower(raw, "vision", _VISION_FIELDS, where)}
        values["projection_dim"] = self.projection_dim(raw, values)
        if "logit_scale_init_value" in raw:
            values["logit_scale_init_value"] = raw["logit_scale_init_value"]
        if "image_size" in values:
            values["image_size"] = pair(values["image_size"])
        return build_config(ClipConfig, {**values, "model_type": self.model_type}, where)

    def projection_dim(self, raw: Mapping[str, Any], values: dict[str, Any]) -> int:
        """The joint space's width (CLIP's `projection_dim`)."""
        return raw.get("projection_dim", ClipConfig.projection_dim)

    def hub_config(self, config: Config) -> dict[str, Any]:
        if not isinstance(config, ClipConfig):
            raise ConfigError(f"a {self.model_type} config.json holds a clip, not a "
                              f"{config.arch}")
        text = {hf: getattr(config, zoo) for hf, zoo in _TEXT_FIELDS.items()}
        vision = {hf: getattr(config, zoo) for hf, zoo in _VISION_FIELDS.items()}
        height, width = config.image_size
        if height != width:
            raise ConfigError(f"a {self.model_type} config.json holds a square image_size, "
                              f"found {config.image_size}")
        vision["image_size"] = height
        return {"architectures": [f"{self.prefix}Model"], "model_type": self.model_type,
                **self.top(config),
                "text_config": {"model_type": f"{self.model_type}_text_model", **text,
                                **self.text_extra(config)},
                "vision_config": {"model_type": f"{self.model_type}_vision_model", **vision}}

    def top(self, config: ClipConfig) -> dict[str, Any]:
        return {}

    def text_extra(self, config: ClipConfig) -> dict[str, Any]:
        return {}


class ClipReader(TwoTowerReader):
    model_type = "clip"
    prefix = "CLIP"
    adapter: ClassVar[Adapter | None] = HF_CLIP_MODEL
    defaults: ClassVar[dict[str, Any]] = {}

    def top(self, config: ClipConfig) -> dict[str, Any]:
        return {"projection_dim": config.projection_dim,
                "logit_scale_init_value": config.logit_scale_init_value}


class SiglipReader(TwoTowerReader):
    model_type = "siglip"
    prefix = "Siglip"
    adapter: ClassVar[Adapter | None] = HF_SIGLIP_MODEL
    defaults: ClassVar[dict[str, Any]] = {  # SiglipTextConfig's, SiglipVisionConfig's
        "vocab_size": 32000, "text_hidden_size": 768, "text_intermediate_size": 3072,
        "text_num_attention_heads": 12, "text_hidden_act": "gelu_pytorch_tanh",
        "text_layer_norm_eps": 1e-6, "max_position_embeddings": 64, "patch_size": 16,
        "vision_hidden_act": "gelu_pytorch_tanh", "vision_layer_norm_eps": 1e-6,
        "logit_scale_init_value": math.log(10.0), "logit_bias_init_value": -10.0}

    def projection_dim(self, raw: Mapping[str, Any], values: dict[str, Any]) -> int:
        """The text head's width: `projection_size`, by default the text tower's width."""
        text = {**(raw.get("text_config") or {})}
        return text.get("projection_size", values["text_hidden_size"])

    def text_extra(self, config: ClipConfig) -> dict[str, Any]:
        return {"projection_size": config.projection_dim}


READERS: tuple[HubReader, ...] = (ClipReader(), SiglipReader())
