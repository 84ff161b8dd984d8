"""transformers' Gemma family `config.json`: one `HubReader` per `model_type` (`gemma`,
`gemma2`, `gemma3_text`), read into and written from the zoo's `gemma` config as the Llama
family's readers do (`hf_lm`: a field the zoo computes is read, an inert one ignored, any other
refused by name). `gemma3` (`Gemma3ForConditionalGeneration`, the multimodal checkpoints of
Gemma 3 4B, 12B and 27B) is refused in one line. Rotary settings are read in both of
transformers' spellings (`rope_theta`, `rope_local_base_freq`, `rope_scaling` of the published
files; `rope_parameters`, per layer type for Gemma 3, of transformers 5) and written in the
first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.config_readers import HubReader, ModelTypeReader
from converters.adapters.hf_lm import build_config, must, refuse_fields, rope_fields
from zoo.configs import Config, ConfigError
from zoo.models.gemma.config import FULL, GEMMA2, GEMMA3, SLIDING, GemmaConfig, pattern

_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
          "max_position_embeddings", "tie_word_embeddings", "attention_bias")
_COMMON = ("rope_theta", "rope_scaling", "rope_parameters", "hidden_act", "hidden_activation",
           "attention_dropout", "use_bidirectional_attention", "cache_implementation")
_GEMMA2 = ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
           "sliding_window", "layer_types")
_TANH = "gelu_pytorch_tanh"


_ROPE_TYPES = {"default": {}, "linear": {"factor": "rope_factor"}}


def _rope_entry(params: Mapping[str, Any], where: str, field: str) -> dict[str, Any]:
    """The zoo's rotary fields of one rotary setting ('default' or 'linear' scaling)."""
    return rope_fields(params, where, field, _ROPE_TYPES, "the zoo's gemma")


def _mapping(raw: Mapping[str, Any], field: str, where: str) -> dict[str, Any]:
    value = raw.get(field)
    if value is not None and not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {field} must be an object or null, found {value!r}")
    return dict(value or {})


class GemmaFamilyReader(ModelTypeReader):
    """`config.json` of one `model_type` of the Gemma family (its transformers class's
    defaults for absent fields), read into and written from the zoo's `gemma` config."""

    arch: ClassVar[str] = "gemma"
    cls_name: ClassVar[str]
    activation: ClassVar[str]  # the field transformers' class reads its activation from
    defaults: ClassVar[dict[str, Any]]  # the class's defaults and options, as zoo fields
    fields: ClassVar[tuple[str, ...]] = ()  # the class's own option fields

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        family = f"{self.model_type} ({self.cls_name})"
        refuse_fields(raw, {*_SIZES, *_COMMON, *self.fields}, where, family)
        must(raw, "attention_dropout", (0, 0.0), where, family)
        must(raw, "use_bidirectional_attention", (None, False), where, family)
        for field in ("hidden_act", "hidden_activation"):  # the other one is not read
            allowed = self.allowed_activations if field == self.activation else (None, _TANH)
            must(raw, field, allowed, where, family)
        values = {**self.defaults, **{k: raw[k] for k in _SIZES if k in raw}}
        values |= self.options(raw, where)
        return build_config(GemmaConfig, {**values, "model_type": self.model_type}, where)

    allowed_activations: ClassVar[tuple[str, ...]] = (_TANH,)

    def options(self, raw: Mapping[str, Any], where: str) -> dict[str, Any]:
        """The zoo fields of the rotary settings and the class's own options."""
        params = _mapping(raw, "rope_parameters", where)
        params.update(_mapping(raw, "rope_scaling", where))
        field = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
        out = _rope_entry(params, where, field)
        if "rope_theta" not in out and "rope_theta" in raw:
            out["rope_theta"] = raw["rope_theta"]
        return out

    def hub_config(self, config: Config) -> dict[str, Any]:
        if not isinstance(config, GemmaConfig):
            raise ConfigError(f"a {self.model_type} config.json holds a gemma, not a "
                              f"{config.arch}")
        for problem in self.problems(config):
            raise ConfigError(f"{self.cls_name} (model_type {self.model_type!r}) has no "
                              f"{problem}; set model_type to a class that has it")
        scaling = (None if config.rope_type == "default" else
                   {"rope_type": config.rope_type, "factor": config.rope_factor})
        return {"architectures": [self.cls_name], "model_type": self.model_type,
                **{k: getattr(config, k) for k in _SIZES}, self.activation: _TANH,
                "rope_theta": config.rope_theta, "rope_scaling": scaling,
                **self.written_options(config)}

    def problems(self, config: GemmaConfig) -> list[str]:
        """The options of `config` this class cannot express (empty: it can)."""
        return []

    def written_options(self, config: GemmaConfig) -> dict[str, Any]:
        return {}


class GemmaReader(GemmaFamilyReader):
    model_type = "gemma"
    cls_name = "GemmaForCausalLM"
    activation = "hidden_act"
    allowed_activations = ("gelu", _TANH)  # transformers reads the legacy "gelu" as tanh's
    defaults: ClassVar[dict[str, Any]] = {}

    def problems(self, config):
        return [p for p, bad in (
            ("post-norms (post_norms)", config.post_norms),
            ("per-head q/k norm (qk_norm)", config.qk_norm),
            ("soft-capping (attn_logit_softcapping, final_logit_softcapping)",
             config.attn_logit_softcapping or config.final_logit_softcapping),
            ("sliding window (sliding_window, layer_types)",
             config.sliding_window is not None or config.layer_types is not None),
            ("query_pre_attn_scalar other than head_dim",
             config.query_pre_attn_scalar not in (None, config.head_dim)),
            ("local rotary base (rope_local_base_freq)",
             config.rope_local_base_freq is not None)) if bad]


class Gemma2Reader(GemmaFamilyReader):
    model_type = "gemma2"
    cls_name = "Gemma2ForCausalLM"
    activation = "hidden_activation"
    defaults: ClassVar[dict[str, Any]] = {
        **GEMMA2, "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "query_pre_attn_scalar": 256}
    fields = (*_GEMMA2, "sliding_window_size")
    every: ClassVar[int] = 2  # transformers' default pattern of sliding and full layers

    def options(self, raw, where):
        out = super().options(raw, where)
        if raw.get("sliding_window_size", raw.get("sliding_window")) != raw.get("sliding_window"):
            raise ConfigError(f"{where}: sliding_window_size {raw['sliding_window_size']!r} "
                              f"differs from sliding_window {raw.get('sliding_window')!r}")
        for field in _GEMMA2[:-1]:
            if field in raw:
                out[field] = raw[field]
        layers = raw.get("num_hidden_layers", self.defaults["num_hidden_layers"])
        out["layer_types"] = raw.get("layer_types") or pattern(layers, self.window_pattern(raw))
        return out

    def window_pattern(self, raw: Mapping[str, Any]) -> int:
        return self.every

    def problems(self, config):
        return [p for p, bad in (
            ("model without post-norms (post_norms false)", not config.post_norms),
            ("per-head q/k norm (qk_norm)", config.qk_norm),
            ("sliding window on every layer without layer_types",
             config.sliding_window is not None and config.layer_types is None),
            ("local rotary base (rope_local_base_freq)",
             config.rope_local_base_freq is not None)) if bad]

    def written_options(self, config):
        return {"query_pre_attn_scalar": config.query_pre_attn_scalar or config.head_dim,
                "attn_logit_softcapping": config.attn_logit_softcapping,
                "final_logit_softcapping": config.final_logit_softcapping,
                "sliding_window": config.sliding_window,
                "layer_types": list(config.layer_types or (FULL,) * config.num_hidden_layers)}


class Gemma3TextReader(Gemma2Reader):
    model_type = "gemma3_text"
    cls_name = "Gemma3ForCausalLM"
    defaults: ClassVar[dict[str, Any]] = {
        **{k: v for k, v in Gemma2Reader.defaults.items() if k not in GEMMA2}, **GEMMA3,
        "sliding_window": 4096}
    # `_sliding_window_pattern`: transformers 5 saves the pattern it read (never read back)
    fields = (*_GEMMA2, "rope_local_base_freq", "sliding_window_pattern",
              "_sliding_window_pattern")
    every = 6

    def window_pattern(self, raw):
        return raw.get("sliding_window_pattern", self.every)

    def options(self, raw, where):
        params = _mapping(raw, "rope_parameters", where)
        if params and set(params) <= {FULL, SLIDING}:  # transformers 5: one per layer type
            full, local = dict(params.get(FULL) or {}), dict(params.get(SLIDING) or {})
        else:
            full, local = params, {}
        read = super().options({**raw, "rope_parameters": full}, where)  # + rope_scaling
        if _rope_entry(local, where, "rope_parameters.sliding_attention")["rope_type"] != \
                "default":
            raise ConfigError(f"{where}: rope_parameters.sliding_attention: the zoo's "
                              "gemma3_text scales only the full-attention layers' rotary "
                              "embedding")
        base = local.get("rope_theta", raw.get("rope_local_base_freq"))
        return read | ({} if base is None else {"rope_local_base_freq": base})

    def problems(self, config):
        return [p for p, bad in (
            ("model without post-norms (post_norms false)", not config.post_norms),
            ("model without per-head q/k norm (qk_norm false)", not config.qk_norm),
            ("sliding window on every layer without layer_types",
             config.sliding_window is not None and config.layer_types is None),
            ("scaled rotary embedding on sliding layers (rope_local_base_freq null with "
             "rope_type linear)",
             config.rope_local_base_freq is None and config.rope_type != "default")) if bad]

    def written_options(self, config):
        base = config.rope_local_base_freq
        return {**super().written_options(config),
                "rope_local_base_freq": config.rope_theta if base is None else base}


class Gemma3MultimodalReader(ModelTypeReader):
    """`model_type: gemma3` (`Gemma3ForConditionalGeneration`): refused in one line."""

    model_type: ClassVar[str] = "gemma3"

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        raise ConfigError(
            f"{where}: model_type 'gemma3' is Gemma3ForConditionalGeneration, a multimodal "
            "checkpoint (a SigLIP vision tower and projector, the text model's weights under "
            "language_model.): the zoo reads Gemma 3's text model from a gemma3_text "
            "checkpoint (gemma-3-1b); gemma-3-4b, -12b and -27b are built by config only")


READERS: tuple[HubReader, ...] = (GemmaReader(), Gemma2Reader(), Gemma3TextReader(),
                                  Gemma3MultimodalReader())
