"""transformers' language models' `config.json`: one `HubReader` per `model_type` (`gpt2`,
`llama`, `mistral`, `qwen2`, `qwen3`), read into the zoo's `gpt2` / `llama` configs and written
back. Their weights need no adapter: the zoo's canonical names are transformers' own, and a
tied head (`lm_head.weight` beside the embedding, when a file has it) is the architecture's
tie (`Config.ties`, `canonical.ties`).

Each reader knows which fields change the function. A field the zoo computes is read (absent:
transformers' default); one that does not change the function (token ids, dtype, generation
settings, bookkeeping) is ignored; one whose value the zoo does not compute is refused by name
with its value (sliding-window layers of Qwen, MoE experts, a `rope_scaling` type other than
Llama 3's, an activation other than SiLU, attention dropout); any other field is refused by
name, as unknown. Both of transformers' spellings of the rotary settings are read: `rope_theta`
with `rope_scaling` (the published files) and `rope_parameters` (transformers 5); files are
written in the first, which every transformers version reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.config_readers import HubReader, ModelTypeReader
from zoo.configs import Config, ConfigError
from zoo.models.gpt2.config import GPT2Config
from zoo.models.llama.config import LlamaConfig

# Fields of transformers' `PretrainedConfig` and generation settings that do not change the
# function a model computes from its weights.
_INERT = frozenset({
    "architectures", "model_type", "transformers_version", "_name_or_path", "dtype",
    "torch_dtype", "use_cache", "initializer_range", "bos_token_id", "eos_token_id",
    "pad_token_id", "sep_token_id", "decoder_start_token_id", "tokenizer_class", "prefix",
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
    "tf_legacy_loss", "pruned_heads", "chunk_size_feed_forward", "is_decoder",
    "is_encoder_decoder", "cross_attention_hidden_size", "tie_encoder_decoder", "max_length",
    "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "finetuning_task", "id2label", "label2id",
    "num_labels", "problem_type", "task_specific_params", "_attn_implementation_autoset",
    "gradient_checkpointing", "output_past", "auto_map"})
# Fields of mixture-of-experts configs: their presence means experts the zoo does not build.
_MOE = ("num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
        "shared_expert_intermediate_size", "decoder_sparse_step", "router_aux_loss_coef",
        "norm_topk_prob", "output_router_logits", "mlp_only_layers", "first_k_dense_replace",
        "n_routed_experts", "n_shared_experts")


def refuse_fields(raw: Mapping[str, Any], known: set[str], where: str, family: str) -> None:
    """Refuse the fields of `raw` neither `known` nor inert; a dense family's (one that knows
    no mixture-of-experts field) set mixture-of-experts fields first, as such."""
    unset = {k for k in _MOE if raw.get(k) in (None, 0, [], False)}
    dense = not known & set(_MOE)
    moe = [k for k in _MOE if dense and k not in unset and k in raw]
    if moe:
        raise ConfigError(f"{where}: mixture-of-experts fields ({', '.join(moe)}): the zoo's "
                          f"{family} models are dense")
    unknown = sorted(set(raw) - known - _INERT - unset)
    if unknown:
        raise ConfigError(f"{where}: {family} config field(s) {', '.join(unknown)} have no "
                          "counterpart in the zoo (unknown: refused rather than ignored)")


def must(raw: Mapping[str, Any], field: str, allowed: tuple[Any, ...], where: str,
          family: str) -> None:
    """Refuse `field` unless absent or one of `allowed` (values the zoo computes)."""
    if field in raw and raw[field] not in allowed:
        raise ConfigError(f"{where}: {field} {raw[field]!r} is not supported by the zoo's "
                          f"{family} (supported: {', '.join(map(repr, allowed))})")


def build_config(cls: type[Config], values: Mapping[str, Any], where: str) -> Config:
    try:
        return cls(**values)
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"{where}: {e}") from e


# --------------------------------------------------------------------------- GPT-2
_GPT2_FIELDS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
                "activation_function", "layer_norm_epsilon", "embd_pdrop", "attn_pdrop",
                "resid_pdrop", "tie_word_embeddings")
# GPT2Config's fields that change nothing the zoo computes: the double-heads model's summary
# head, the legacy `n_ctx` (= n_positions); `reorder_and_upcast_attn` computes the attention
# in float32, as the zoo always does.
_GPT2_INERT = {"n_ctx", "summary_type", "summary_use_proj", "summary_activation",
               "summary_proj_to_labels", "summary_first_dropout", "n_special",
               "predict_special_tokens", "reorder_and_upcast_attn"}
_GPT2_FIXED = {"scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,),
               "add_cross_attention": (False,)}
GPT2_VOCAB = 50257  # the GPT-2 tokenizer's; its end-of-text token is the last id


class GPT2Reader(ModelTypeReader):
    """`config.json` with `model_type: gpt2` (transformers' `GPT2Config` and its defaults)."""

    model_type: ClassVar[str] = "gpt2"
    arch: ClassVar[str] = "gpt2"

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        refuse_fields(raw, {*_GPT2_FIELDS, *_GPT2_INERT, *_GPT2_FIXED}, where, "GPT-2")
        for field, allowed in _GPT2_FIXED.items():
            must(raw, field, allowed, where, "GPT-2")
        must(raw, "activation_function", ("gelu_new", "gelu_pytorch_tanh", "gelu", "relu"),
              where, "GPT-2")
        return build_config(GPT2Config, {k: raw[k] for k in _GPT2_FIELDS if k in raw}, where)

    def hub_config(self, config: Config) -> dict[str, Any]:
        if not isinstance(config, GPT2Config):
            raise ConfigError(f"a GPT-2 config.json holds a gpt2, not a {config.arch}")
        eos = GPT2_VOCAB - 1 if config.vocab_size >= GPT2_VOCAB else None
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                **{k: getattr(config, k) for k in _GPT2_FIELDS}, "n_ctx": config.n_positions,
                "bos_token_id": eos, "eos_token_id": eos}


# --------------------------------------------------------------------------- Llama family
_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
          "max_position_embeddings", "tie_word_embeddings")
_ROPE = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor")
_LLAMA3 = {"factor": "rope_factor", "low_freq_factor": "rope_low_freq_factor",
           "high_freq_factor": "rope_high_freq_factor",
           "original_max_position_embeddings": "rope_original_max_position_embeddings"}
_QWEN_WINDOW = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")


def rope_fields(params: Mapping[str, Any], where: str, field: str,
                types: Mapping[str, Mapping[str, str]], family: str = "the zoo",
                also: tuple[str, ...] = ()) -> dict[str, Any]:
    """The zoo's rotary fields of one transformers rotary setting `params` (read from
    `field`): `types` maps each supported `rope_type` to its entries and their zoo field
    names (each required); `rope_theta` is read where present; an unsupported type, a
    missing entry or another entry (but `also`) is refused by name."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in types:
        raise ConfigError(f"{where}: {field} type {kind!r} is not supported by {family} "
                          f"(supported: {', '.join(map(repr, types))})")
    entries = types[kind]
    missing = [k for k in entries if k not in params]
    if missing:
        raise ConfigError(f"{where}: {field} of type {kind!r} lacks {', '.join(missing)}")
    unknown = set(params) - {"rope_type", "type", "rope_theta", *also, *entries}
    if unknown:
        raise ConfigError(f"{where}: {field} entries {sorted(unknown)} are not supported by "
                          f"{family}")
    out: dict[str, Any] = {"rope_type": kind, **{zoo: params[hf] for hf, zoo in entries.items()}}
    if params.get("rope_theta") is not None:
        out["rope_theta"] = params["rope_theta"]
    return out


def _rope(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The rotary fields of the zoo's config from `rope_theta` / `rope_scaling` or
    `rope_parameters`; an unknown scaling type or a partial rotation is refused by name."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ConfigError(f"{where}: rope_scaling must be an object or null, found {scaling!r}")
    params.update(scaling or {})
    if params.get("rope_type", params.get("type")) == "llama3":
        params.setdefault("original_max_position_embeddings",
                          raw.get("max_position_embeddings", 2048))
    field = "rope_scaling" if scaling else "rope_parameters"
    out = rope_fields(params, where, field, {"default": {}, "llama3": _LLAMA3},
                      also=("partial_rotary_factor",))
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ConfigError(f"{where}: partial_rotary_factor {partial!r}: the zoo rotates whole "
                          "heads")
    if "rope_theta" not in out and raw.get("rope_theta") is not None:
        out["rope_theta"] = raw["rope_theta"]
    return out


class LlamaFamilyReader(ModelTypeReader):
    """`config.json` of one `model_type` of the Llama family (its transformers class's
    defaults for absent fields), read into and written from the zoo's `llama` config."""

    arch: ClassVar[str] = "llama"
    cls_name: ClassVar[str]
    defaults: ClassVar[dict[str, Any]]  # transformers' defaults that differ from the zoo's
    fields: ClassVar[tuple[str, ...]] = ()  # the class's own option fields

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        family = f"{self.model_type} ({self.cls_name})"
        known = {*_SIZES, *_ROPE, "hidden_act", "attention_dropout", "pretraining_tp",
                 "use_mrope", *self.fields}
        refuse_fields(raw, known, where, family)
        must(raw, "hidden_act", ("silu",), where, family)
        must(raw, "attention_dropout", (0, 0.0), where, family)
        must(raw, "pretraining_tp", (1,), where, family)
        must(raw, "use_mrope", (False,), where, family)
        values = {**self.defaults, **{k: raw[k] for k in _SIZES if k in raw}}
        values |= _rope(raw, where)
        values |= self.options(raw, where, family)
        return build_config(LlamaConfig, {**values, "model_type": self.model_type}, where)

    def options(self, raw: Mapping[str, Any], where: str, family: str) -> dict[str, Any]:
        """The zoo fields of the class's own options."""
        return {}

    def hub_config(self, config: Config) -> dict[str, Any]:
        if not isinstance(config, LlamaConfig):
            raise ConfigError(f"a {self.model_type} config.json holds a llama, not a "
                              f"{config.arch}")
        for problem in self.problems(config):
            raise ConfigError(f"{self.cls_name} (model_type {self.model_type!r}) has no "
                              f"{problem}; set model_type to a class that has it")
        rope = None if config.rope_type == "default" else {
            "rope_type": config.rope_type,
            **{hf: getattr(config, zoo) for hf, zoo in _LLAMA3.items()}}
        return {"architectures": [self.cls_name], "model_type": self.model_type,
                **{k: getattr(config, k) for k in _SIZES},
                "num_key_value_heads": config.kv_heads, "head_dim": config.dim,
                "hidden_act": "silu", "rope_theta": config.rope_theta, "rope_scaling": rope,
                **self.written_options(config)}

    def problems(self, config: LlamaConfig) -> list[str]:
        """The options of `config` this class cannot express (empty: it can)."""
        return []

    def written_options(self, config: LlamaConfig) -> dict[str, Any]:
        return {}


class LlamaReader(LlamaFamilyReader):
    model_type = "llama"
    cls_name = "LlamaForCausalLM"
    defaults: ClassVar[dict[str, Any]] = {}
    fields = ("attention_bias", "mlp_bias")

    def options(self, raw, where, family):
        return {"attention_bias": raw.get("attention_bias", False),
                "mlp_bias": raw.get("mlp_bias", False)}

    def problems(self, config):
        return [p for p, bad in (
            ("q/k/v biases without an o_proj bias (qkv_bias; attention_bias covers all four)",
             config.qkv_bias and not config.attention_bias),
            ("per-head q/k norm (qk_norm)", config.qk_norm),
            ("sliding window (sliding_window)", config.sliding_window is not None)) if bad]

    def written_options(self, config):
        return {"attention_bias": config.attention_bias, "mlp_bias": config.mlp_bias}


class MistralReader(LlamaFamilyReader):
    model_type = "mistral"
    cls_name = "MistralForCausalLM"
    defaults: ClassVar[dict[str, Any]] = {
        "vocab_size": 32000, "intermediate_size": 14336, "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32, "sliding_window": 4096}
    fields = ("sliding_window",)

    def options(self, raw, where, family):
        return {"sliding_window": raw.get("sliding_window", 4096)}

    def problems(self, config):
        return [p for p, bad in (
            ("biases (attention_bias, qkv_bias, mlp_bias)",
             config.attention_bias or config.qkv_bias or config.mlp_bias),
            ("per-head q/k norm (qk_norm)", config.qk_norm)) if bad]

    def written_options(self, config):
        return {"sliding_window": config.sliding_window}


class _QwenReader(LlamaFamilyReader):
    """Qwen2 / Qwen3: their sliding-window layers (`use_sliding_window`) are refused; the
    window fields are inert without it."""

    fields = _QWEN_WINDOW

    def window(self, raw: Mapping[str, Any], where: str, family: str) -> None:
        must(raw, "use_sliding_window", (False,), where, family)
        types = raw.get("layer_types")
        if types is not None and any(t != "full_attention" for t in types):
            raise ConfigError(f"{where}: layer_types {sorted(set(types))}: the zoo's "
                              f"{family} has full attention in every layer")


class Qwen2Reader(_QwenReader):
    model_type = "qwen2"
    cls_name = "Qwen2ForCausalLM"
    defaults: ClassVar[dict[str, Any]] = {
        "vocab_size": 151936, "intermediate_size": 22016, "max_position_embeddings": 32768,
        "qkv_bias": True}

    def options(self, raw, where, family):
        self.window(raw, where, family)
        return {"qkv_bias": True}

    def problems(self, config):
        return [p for p, bad in (
            ("model without q/k/v biases (qkv_bias false)", not config.qkv_biased),
            ("o_proj or MLP bias (attention_bias, mlp_bias)",
             config.attention_bias or config.mlp_bias),
            ("per-head q/k norm (qk_norm)", config.qk_norm),
            ("sliding window (sliding_window)", config.sliding_window is not None)) if bad]

    def written_options(self, config):
        return {"use_sliding_window": False}


class Qwen3Reader(_QwenReader):
    model_type = "qwen3"
    cls_name = "Qwen3ForCausalLM"
    defaults: ClassVar[dict[str, Any]] = {
        "vocab_size": 151936, "intermediate_size": 22016, "max_position_embeddings": 32768,
        "head_dim": 128, "qk_norm": True}
    fields = (*_QWEN_WINDOW, "attention_bias")

    def options(self, raw, where, family):
        self.window(raw, where, family)
        return {"qk_norm": True, "attention_bias": raw.get("attention_bias", False)}

    def problems(self, config):
        return [p for p, bad in (
            ("model without per-head q/k norm (qk_norm false)", not config.qk_norm),
            ("q/k/v biases without an o_proj bias (qkv_bias)",
             config.qkv_bias and not config.attention_bias),
            ("MLP bias (mlp_bias)", config.mlp_bias),
            ("sliding window (sliding_window)", config.sliding_window is not None)) if bad]

    def written_options(self, config):
        return {"attention_bias": config.attention_bias, "use_sliding_window": False}


READERS: tuple[HubReader, ...] = (GPT2Reader(), LlamaReader(), MistralReader(), Qwen2Reader(),
                                  Qwen3Reader())
