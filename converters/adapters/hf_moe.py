"""transformers' mixtures of experts: the `config.json` of `mixtral` (`MixtralForCausalLM`) and
`qwen3_moe` (`Qwen3MoeForCausalLM`), read into and written from the zoo's `mixtral` config as
the Llama family's readers do (`hf_lm`: a field the zoo computes is read, an inert one
ignored, any other refused by name), and the layout of their files.

transformers' models hold each layer's experts fused, `mlp.experts.gate_up_proj`
`(E, 2 * width, hidden)` and `mlp.experts.down_proj` `(E, hidden, width)`: the zoo's canonical
names. Their files (the Hub's, and what `save_pretrained` writes) store them one expert at a
time: Mixtral's `block_sparse_moe.experts.N.w1` (gate), `w3` (up), `w2` (down) and
`block_sparse_moe.gate`, Qwen3-MoE's `mlp.experts.N.{gate,up,down}_proj`. Each is one
adapter (`HF_MIXTRAL`, `HF_QWEN3_MOE`) that stacks them on reading and unstacks them on
writing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.adapter import Adapter, Rename, Stack
from converters.adapters.config_readers import ModelTypeReader
from converters.adapters.hf_lm import build_config, must, refuse_fields, rope_fields
from zoo.configs import Config, ConfigError
from zoo.models.mixtral.config import MixtralConfig

_LAYER = "model.layers.{i}."
_COMMON_KEYS = (Rename("model.embed_tokens.weight", "model.embed_tokens.weight"),
                Rename(_LAYER + "self_attn.{p}.weight", _LAYER + "self_attn.{p}.weight"),
                Rename(_LAYER + "self_attn.{p}.bias", _LAYER + "self_attn.{p}.bias"),
                Rename(_LAYER + "input_layernorm.weight", _LAYER + "input_layernorm.weight"),
                Rename(_LAYER + "post_attention_layernorm.weight",
                       _LAYER + "post_attention_layernorm.weight"),
                Rename("model.norm.weight", "model.norm.weight"),
                Rename("lm_head.weight", "lm_head.weight"))
_GATE_UP, _DOWN = _LAYER + "mlp.experts.gate_up_proj", _LAYER + "mlp.experts.down_proj"
_MOE = _LAYER + "block_sparse_moe."
HF_MIXTRAL = Adapter(
    "hf_mixtral", "transformers' Mixtral files (one tensor per expert)", "mixtral",
    renames=(Rename(_MOE + "gate.weight", _LAYER + "mlp.gate.weight"), *_COMMON_KEYS),
    stacks=(Stack((_MOE + "experts.{j}.w1.weight", _MOE + "experts.{j}.w3.weight"), _GATE_UP,
                  "the experts' w1 and w3"),
            Stack((_MOE + "experts.{j}.w2.weight",), _DOWN, "the experts' w2")))
_EXPERT = _LAYER + "mlp.experts.{j}."
HF_QWEN3_MOE = Adapter(
    "hf_qwen3_moe", "transformers' Qwen3-MoE files (one tensor per expert)", "mixtral",
    # the router `mlp.gate` and the dense layers' `mlp.{gate,up,down}_proj`
    renames=(Rename(_LAYER + "mlp.{p}.weight", _LAYER + "mlp.{p}.weight"), *_COMMON_KEYS),
    stacks=(Stack((_EXPERT + "gate_proj.weight", _EXPERT + "up_proj.weight"), _GATE_UP,
                  "the experts' gate_proj and up_proj"),
            Stack((_EXPERT + "down_proj.weight",), _DOWN, "the experts' down_proj")))

_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
          "max_position_embeddings", "tie_word_embeddings", "num_experts_per_tok",
          "router_aux_loss_coef", "output_router_logits")
_COMMON = ("rope_theta", "rope_scaling", "rope_parameters", "hidden_act", "attention_dropout",
           "num_local_experts", "num_experts")


class MoEReader(ModelTypeReader):
    """`config.json` of one transformers mixture of experts (its class's defaults for absent
    fields), read into and written from the zoo's `mixtral` config."""

    arch: ClassVar[str] = "mixtral"
    cls_name: ClassVar[str]
    defaults: ClassVar[dict[str, Any]]  # the class's defaults and options, as zoo fields
    fields: ClassVar[tuple[str, ...]] = ()  # the class's own option fields

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        family = f"{self.model_type} ({self.cls_name})"
        refuse_fields(raw, {*_SIZES, *_COMMON, *self.fields}, where, family)
        must(raw, "hidden_act", ("silu",), where, family)
        must(raw, "attention_dropout", (0, 0.0), where, family)
        values = {**self.defaults, **{k: raw[k] for k in _SIZES if k in raw}}
        experts = raw.get("num_local_experts", raw.get("num_experts"))
        if experts is not None:
            values["num_local_experts"] = experts
        params = dict(raw.get("rope_parameters") or {})
        params.update(raw.get("rope_scaling") or {})
        field = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
        rope = rope_fields(params, where, field, {"default": {}}, f"the zoo's {family}")
        rope.pop("rope_type")
        values |= rope
        if "rope_theta" not in rope and raw.get("rope_theta") is not None:
            values["rope_theta"] = raw["rope_theta"]
        values |= self.options(raw, where, family)
        return build_config(MixtralConfig, {**values, "model_type": self.model_type}, where)

    def options(self, raw: Mapping[str, Any], where: str, family: str) -> dict[str, Any]:
        """The zoo fields of the class's own options."""
        return {}

    def hub_config(self, config: Config) -> dict[str, Any]:
        if not isinstance(config, MixtralConfig):
            raise ConfigError(f"a {self.model_type} config.json holds a mixtral, not a "
                              f"{config.arch}")
        for problem in self.problems(config):
            raise ConfigError(f"{self.cls_name} (model_type {self.model_type!r}) has no "
                              f"{problem}; set model_type to a class that has it")
        return {"architectures": [self.cls_name], "model_type": self.model_type,
                **{k: getattr(config, k) for k in _SIZES}, "head_dim": config.dim,
                "hidden_act": "silu", "rope_theta": config.rope_theta,
                **self.written_options(config)}

    def problems(self, config: MixtralConfig) -> list[str]:
        """The options of `config` this class cannot express (empty: it can)."""
        return []

    def written_options(self, config: MixtralConfig) -> dict[str, Any]:
        return {}


class MixtralReader(MoEReader):
    model_type = "mixtral"
    cls_name = "MixtralForCausalLM"
    adapter = HF_MIXTRAL
    defaults: ClassVar[dict[str, Any]] = {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
        "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001}
    fields = ("sliding_window", "router_jitter_noise")

    def options(self, raw, where, family):
        must(raw, "router_jitter_noise", (0, 0.0), where, family)
        return {"sliding_window": raw.get("sliding_window")}

    def problems(self, config):
        return [p for p, bad in (
            ("per-head q/k norm (qk_norm)", config.qk_norm),
            ("attention biases (attention_bias)", config.attention_bias),
            ("top-k weights left unnormalised (norm_topk_prob false)",
             not config.norm_topk_prob),
            ("experts of their own width (moe_intermediate_size)",
             config.moe_intermediate_size not in (None, config.intermediate_size)),
            ("dense layers (mlp_only_layers, decoder_sparse_step)",
             len(config.sparse_layers) != config.num_hidden_layers)) if bad]

    def written_options(self, config):
        return {"sliding_window": config.sliding_window,
                "num_local_experts": config.num_local_experts}


class Qwen3MoeReader(MoEReader):
    model_type = "qwen3_moe"
    cls_name = "Qwen3MoeForCausalLM"
    adapter = HF_QWEN3_MOE
    defaults: ClassVar[dict[str, Any]] = {
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
        "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 4,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "num_local_experts": 128, "num_experts_per_tok": 8, "router_aux_loss_coef": 0.001,
        "qk_norm": True, "moe_intermediate_size": 768, "norm_topk_prob": False}
    fields = ("use_sliding_window", "sliding_window", "max_window_layers", "attention_bias",
              "decoder_sparse_step", "mlp_only_layers", "moe_intermediate_size",
              "norm_topk_prob")

    def options(self, raw, where, family):
        must(raw, "use_sliding_window", (False,), where, family)
        return {"attention_bias": raw.get("attention_bias", False),
                "decoder_sparse_step": raw.get("decoder_sparse_step", 1),
                "mlp_only_layers": tuple(raw.get("mlp_only_layers") or ()),
                "moe_intermediate_size": raw.get("moe_intermediate_size", 768),
                "norm_topk_prob": raw.get("norm_topk_prob", False)}

    def problems(self, config):
        return [p for p, bad in (
            ("model without per-head q/k norm (qk_norm false)", not config.qk_norm),
            ("sliding window (sliding_window)", config.sliding_window is not None)) if bad]

    def written_options(self, config):
        return {"attention_bias": config.attention_bias, "use_sliding_window": False,
                "num_experts": config.num_local_experts,
                "moe_intermediate_size": config.moe_intermediate_size or config.intermediate_size,
                "decoder_sparse_step": config.decoder_sparse_step,
                "mlp_only_layers": list(config.mlp_only_layers),
                "norm_topk_prob": config.norm_topk_prob}


READERS: tuple[ModelTypeReader, ...] = (MixtralReader(), Qwen3MoeReader())
