"""The Gemma family's configuration: transformers' `GemmaConfig`, `Gemma2Config` and
`Gemma3TextConfig` field names and defaults, one config whose options (post-norms, q/k norms,
soft-capping, per-layer attention types, local rotary base) say which generation it is;
`model_type` says which transformers class a written `config.json` names."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from zoo.configs import ConfigError, positive
from zoo.models.decoder import AttentionSpec, DecoderSpec, LayerAttention, MLPSpec, Names
from zoo.models.language import LanguageModelConfig, decoder_sizes

SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' layer types
_OPTIONAL_FLOATS = ("rope_local_base_freq", "attn_logit_softcapping", "final_logit_softcapping")


def pattern(layers: int, every: int) -> tuple[str, ...]:
    """transformers' layer types of a `sliding_window_pattern`: every `every`-th layer full
    attention, the others sliding (Gemma 2: 2, Gemma 3: 6)."""
    return tuple(SLIDING if (i + 1) % every else FULL for i in range(layers))


# The generations' options (what the readers of each `model_type` set, and the named models).
GEMMA2 = {"model_type": "gemma2", "post_norms": True, "attn_logit_softcapping": 50.0,
          "final_logit_softcapping": 30.0, "sliding_window": 4096}
GEMMA3 = {"model_type": "gemma3_text", "post_norms": True, "qk_norm": True,
          "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "vocab_size": 262208,
          "max_position_embeddings": 131072}
_GEMMA3_SCALED = {**GEMMA3, "rope_type": "linear", "rope_factor": 8.0}


def _gemma2(layers: int, **sizes: Any) -> dict[str, Any]:
    return {**GEMMA2, **sizes, "layer_types": pattern(layers, 2)}


def _gemma3(layers: int, window: int, **sizes: Any) -> dict[str, Any]:
    return {**sizes, "sliding_window": window, "layer_types": pattern(layers, 6)}


# The published config.json files (tests/fixtures/hf_configs/ holds them; each named model is
# pinned there to transformers' keys, shapes and parameter count). Gemma 3 4B, 12B and 27B are
# published as multimodal checkpoints: their text models are named here by config only.
NAMED_MODELS: dict[str, dict[str, Any]] = {
    "gemma-2b": decoder_sizes(2048, 16384, 18, 8, 1, 256),
    "gemma-7b": decoder_sizes(3072, 24576, 28, 16, 16, 256),
    "gemma-2-2b": _gemma2(26, **decoder_sizes(2304, 9216, 26, 8, 4, 256)),
    "gemma-2-9b": _gemma2(42, **decoder_sizes(3584, 14336, 42, 16, 8, 256)),
    "gemma-2-27b": _gemma2(46, **decoder_sizes(4608, 36864, 46, 32, 16, 128),
                           query_pre_attn_scalar=144),
    "gemma-3-1b": _gemma3(26, 512, **{**GEMMA3, "vocab_size": 262144,
                                      "max_position_embeddings": 32768},
                          **decoder_sizes(1152, 6912, 26, 4, 1, 256)),
    "gemma-3-4b": _gemma3(34, 1024, **_GEMMA3_SCALED, **decoder_sizes(2560, 10240, 34, 8, 4, 256)),
    "gemma-3-12b": _gemma3(48, 1024, **_GEMMA3_SCALED,
                           **decoder_sizes(3840, 15360, 48, 16, 8, 256)),
    "gemma-3-27b": _gemma3(62, 1024, **_GEMMA3_SCALED,
                           **decoder_sizes(5376, 21504, 62, 32, 16, 128),
                           query_pre_attn_scalar=168),
}
for _named in NAMED_MODELS.values():  # Gemma 2 and 3 files state it; Gemma 1 has no field
    if _named.get("post_norms"):
        _named.setdefault("query_pre_attn_scalar", _named["head_dim"])

NAMES = Names(body="model", embedding="embed_tokens", layers="layers", norm="norm",
              block=(("self_attn", "attention"), ("mlp", "mlp"),
                     ("input_layernorm", "attention_norm"),
                     ("post_attention_layernorm", "mlp_norm")))
# Gemma 2 and 3: each branch's output normed too; the MLP's input norm is then the
# `pre_feedforward_layernorm` and `post_attention_layernorm` the attention's output norm.
POST_NORM_NAMES = Names(body="model", embedding="embed_tokens", layers="layers", norm="norm",
                        block=(("self_attn", "attention"), ("mlp", "mlp"),
                               ("input_layernorm", "attention_norm"),
                               ("post_attention_layernorm", "attention_post_norm"),
                               ("pre_feedforward_layernorm", "mlp_norm"),
                               ("post_feedforward_layernorm", "mlp_post_norm")))

# The releases on the Hub (zoo.create("gemma-2b.base", impl, pretrained=True)); Google's
# repositories are gated: the Hub serves them to an accepted licence's token only.
HUB_REPOS: dict[str, dict[str, Any]] = {
    name: {"base": {"hub": repo, "license": "gemma",
                    **({"file": "model.safetensors.index.json"} if sharded else {})}}
    for name, (repo, sharded) in {
        "gemma-2b": ("google/gemma-2b", True), "gemma-7b": ("google/gemma-7b", True),
        "gemma-2-2b": ("google/gemma-2-2b", True), "gemma-2-9b": ("google/gemma-2-9b", True),
        "gemma-2-27b": ("google/gemma-2-27b", True),
        "gemma-3-1b": ("google/gemma-3-1b-pt", False)}.items()}


@dataclass(frozen=True)
class GemmaConfig(LanguageModelConfig):
    """transformers' `GemmaForCausalLM`, `Gemma2ForCausalLM` and `Gemma3ForCausalLM` (text):
    `model.embed_tokens` (its output times `sqrt(hidden_size)`), decoder layers
    (`input_layernorm`, `self_attn.{q,k,v,o}_proj`, GeGLU `mlp.{gate,up,down}_proj` with
    `gelu_pytorch_tanh`), `model.norm` and the head tied to the embedding (untied:
    `lm_head`); every norm an RMSNorm times `(1 + weight)`, in float32.

    Gemma 2's options: `post_norms` (`post_attention_layernorm` on the attention's output,
    `pre_feedforward_layernorm` / `post_feedforward_layernorm` around the MLP),
    `query_pre_attn_scalar` (scores scaled by its inverse square root; None: `head_dim`),
    `attn_logit_softcapping` and `final_logit_softcapping` (`cap * tanh(x / cap)` of the scores
    and of the logits), `layer_types` (per layer `sliding_attention`, which sees the last
    `sliding_window` tokens, or `full_attention`; None: full everywhere). Gemma 3's:
    `qk_norm` (per-head `self_attn.q_norm` / `k_norm`), `rope_local_base_freq` (the sliding
    layers' rotary base; the full layers' is `rope_theta`, with `rope_type` "linear" scaling
    by `rope_factor`; None: one rotary embedding for all layers). `seq_len` (the zoo's) is the
    length of the examples.
    """

    arch: ClassVar[str] = "gemma"
    REFERENCES: ClassVar[dict[str, str]] = {
        "transformers' Gemma, Gemma 2 and Gemma 3 (text)": "tests/test_language_models.py",
        "the published config.json files, parameter counts": "tests/test_named_language_models.py",
        "transformers' `save_pretrained` folders": "tests/test_hf_language_models.py",
    }
    EMBEDDING: ClassVar[str] = "model.embed_tokens.weight"
    # Gemma 1 with grouped-query attention, tied (the variants in tests/lm_reference.py add
    # Gemma 2's and 3's options).
    TINY: ClassVar[dict[str, Any]] = {
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 512, "seq_len": 8}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = NAMED_MODELS
    HUB_REPOS: ClassVar[dict[str, dict[str, Any]]] = HUB_REPOS
    vocab_size: int = 256000
    hidden_size: int = 3072
    intermediate_size: int = 24576
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: Literal["default", "linear"] = "default"
    rope_factor: float = 1.0
    rope_local_base_freq: float | None = None
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    query_pre_attn_scalar: int | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    post_norms: bool = False
    qk_norm: bool = False
    model_type: Literal["gemma", "gemma2", "gemma3_text"] = "gemma"
    seq_len: int | None = None  # the examples' length (None: 128)

    def __post_init__(self) -> None:
        for name in _OPTIONAL_FLOATS:  # JSON writes 256.0 as 256: equal configs, equal fields
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))
        super().__post_init__()

    def validate(self) -> None:
        positive("gemma sizes", (self.vocab_size, self.hidden_size, self.intermediate_size,
                                 self.num_hidden_layers, self.num_attention_heads,
                                 self.num_key_value_heads, self.head_dim,
                                 self.max_position_embeddings))
        for name in ("sliding_window", "query_pre_attn_scalar"):
            if getattr(self, name) is not None:
                positive(f"gemma.{name}", (getattr(self, name),))
        for name in _OPTIONAL_FLOATS:
            value = getattr(self, name)
            if value is not None and not (isinstance(value, float) and value > 0):
                raise ConfigError(f"gemma.{name} must be a positive number or null, found "
                                  f"{value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"gemma.num_attention_heads {self.num_attention_heads} must be a "
                              f"multiple of num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"gemma: the rotary embedding needs an even head_dim, found "
                              f"{self.head_dim}")
        if not (self.rms_norm_eps > 0 and self.rope_theta > 0 and self.rope_factor > 0):
            raise ConfigError("gemma.rms_norm_eps, rope_theta and rope_factor must be positive")
        if self.layer_types is not None:
            if (len(self.layer_types) != self.num_hidden_layers
                    or not set(self.layer_types) <= {SLIDING, FULL}):
                raise ConfigError(f"gemma.layer_types: one of {SLIDING!r}, {FULL!r} per layer "
                                  f"({self.num_hidden_layers}), found {list(self.layer_types)}")
            if SLIDING in self.layer_types and self.sliding_window is None:
                raise ConfigError("gemma.layer_types has sliding layers: set sliding_window")
        self.check_lengths()

    def rope(self, theta: float, scaled: bool) -> tuple[float, ...]:
        """Rotary inverse frequencies of base `theta`, scaled by `rope_type` if `scaled`."""
        from zoo.layers.causal import rope_frequencies

        kind = self.rope_type if scaled else "default"
        return tuple(float(f) for f in rope_frequencies(self.head_dim, theta, kind,
                                                        self.rope_factor))

    def attention_types(self) -> tuple[tuple[str, LayerAttention], ...]:
        """The two layer types: full attention with the (scaled) `rope_theta` embedding, and
        sliding-window attention with the `rope_local_base_freq` one (else the same)."""
        full = self.rope(self.rope_theta, True)
        local = (full if self.rope_local_base_freq is None
                 else self.rope(self.rope_local_base_freq, False))
        return ((FULL, LayerAttention(None, full)),
                (SLIDING, LayerAttention(self.sliding_window, local)))

    @property
    def decoder(self) -> DecoderSpec:
        """The shared decoder body's options: `(1 + weight)` RMSNorms, `q/k/v/o_proj` with
        grouped key/value heads (q/k norm, scale, soft-capping), GeGLU MLP, rotary positions
        per layer type, scaled embeddings, soft-capped logits."""
        scalar = self.query_pre_attn_scalar or self.head_dim
        return DecoderSpec(
            POST_NORM_NAMES if self.post_norms else NAMES, self.vocab_size, self.hidden_size,
            self.num_hidden_layers, "offset_rms_norm", self.rms_norm_eps,
            AttentionSpec("qkvo", self.num_attention_heads, self.num_key_value_heads,
                          self.head_dim, qkv_bias=self.attention_bias,
                          out_bias=self.attention_bias, qk_norm=self.qk_norm,
                          sliding_window=self.sliding_window if self.layer_types is None
                          else None, scale=scalar ** -0.5,
                          logit_softcap=self.attn_logit_softcapping),
            MLPSpec("gated", self.intermediate_size, "gelu_pytorch_tanh"),
            rope=self.rope(self.rope_theta, True),
            tie_word_embeddings=self.tie_word_embeddings,
            embedding_scale=math.sqrt(self.hidden_size),
            logit_softcap=self.final_logit_softcapping,
            layer_types=self.layer_types,
            attention_types=self.attention_types() if self.layer_types else ())
