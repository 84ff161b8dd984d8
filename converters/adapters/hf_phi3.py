"""transformers' Phi-3 `config.json` (`model_type: phi3`, `Phi3ForCausalLM`), read into and
written from the zoo's `phi3` config as the Llama family's readers do (`hf_lm`: a field the zoo
computes is read, an inert one ignored, any other refused by name). The weights need no
adapter: the zoo's canonical names are transformers' own (`qkv_proj`, `gate_up_proj`).

Rotary settings are read in both of transformers' spellings (`rope_theta`, `rope_scaling`,
`partial_rotary_factor` of the published files; `rope_parameters` of transformers 5) and
written in the first. The 128k-context releases' "longrope" scaling (`short_factor` /
`long_factor` switched at `original_max_position_embeddings`, and an attention factor) is
refused in one line naming it; `original_max_position_embeddings` is inert without it, as is
`embd_pdrop` (transformers' `Phi3Model` applies no embedding dropout).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.config_readers import HubReader, ModelTypeReader
from converters.adapters.hf_lm import build_config, must, refuse_fields, rope_fields
from zoo.configs import Config, ConfigError
from zoo.models.phi3.config import Phi3Config

FAMILY = "phi3 (Phi3ForCausalLM)"
_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
          "max_position_embeddings", "tie_word_embeddings", "sliding_window", "resid_pdrop",
          "attention_dropout")
_ROPE = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor")
_READ = ("hidden_act", "head_dim", "attention_bias", "embd_pdrop",
         "original_max_position_embeddings")
PAD_TOKEN = 32000  # Phi3Config's pad and end-of-text id (the Phi-3 tokenizer's <|endoftext|>)
LONGROPE = ("longrope", "su", "yarn")  # transformers reads Phi-3's "su" and "yarn" as longrope


def _rope(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`rope_theta` and `partial_rotary_factor` from `rope_scaling` or `rope_parameters` (and
    the top level); longrope and any other scaling refused by name."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ConfigError(f"{where}: rope_scaling must be an object or null, found {scaling!r}")
    scaling = dict(scaling or {})
    if "type" in scaling:  # the published files' key: it overrides rope_parameters' rope_type
        scaling.setdefault("rope_type", scaling.pop("type"))
    params.update(scaling)
    field = "rope_scaling" if scaling else "rope_parameters"
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in LONGROPE:
        raise ConfigError(
            f"{where}: {field} type {kind!r} (longrope: short_factor / long_factor switched at "
            f"original_max_position_embeddings, the 128k-context releases) is not supported "
            f"by the zoo's phi3, whose rotary embedding has one set of frequencies")
    out = rope_fields(params, where, field, {"default": {}}, "the zoo's phi3",
                      also=("partial_rotary_factor",))
    del out["rope_type"]
    if "rope_theta" not in out and raw.get("rope_theta") is not None:
        out["rope_theta"] = raw["rope_theta"]
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor"))
    if partial is not None:
        out["partial_rotary_factor"] = partial
    return out


class Phi3Reader(ModelTypeReader):
    """`config.json` with `model_type: phi3` (transformers' `Phi3Config` and its defaults,
    which are the zoo's)."""

    model_type: ClassVar[str] = "phi3"
    arch: ClassVar[str] = "phi3"

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        refuse_fields(raw, {*_SIZES, *_ROPE, *_READ}, where, FAMILY)
        must(raw, "hidden_act", ("silu",), where, FAMILY)
        must(raw, "attention_bias", (False,), where, FAMILY)  # Phi3Attention has none
        hidden = raw.get("hidden_size", Phi3Config.hidden_size)
        heads = raw.get("num_attention_heads", Phi3Config.num_attention_heads)
        if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
            must(raw, "head_dim", (None, hidden // heads), where, FAMILY)
        embd = raw.get("embd_pdrop", 0.0)
        if not (isinstance(embd, int | float) and 0 <= embd < 1):
            raise ConfigError(f"{where}: embd_pdrop must be in [0, 1), found {embd!r}")
        values = {k: raw[k] for k in _SIZES if k in raw} | _rope(raw, where)
        return build_config(Phi3Config, values, where)

    def hub_config(self, config: Config) -> dict[str, Any]:
        if not isinstance(config, Phi3Config):
            raise ConfigError(f"a phi3 config.json holds a phi3, not a {config.arch}")
        pad = PAD_TOKEN if config.vocab_size > PAD_TOKEN else None  # a row it has, or none
        return {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
                "bos_token_id": 1, "eos_token_id": pad, "pad_token_id": pad,
                **{k: getattr(config, k) for k in _SIZES},
                "num_key_value_heads": config.kv_heads, "hidden_act": "silu",
                "rope_theta": config.rope_theta, "rope_scaling": None,
                "partial_rotary_factor": config.partial_rotary_factor}


READERS: tuple[HubReader, ...] = (Phi3Reader(),)
