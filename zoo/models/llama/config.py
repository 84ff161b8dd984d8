"""The Llama family's configuration: transformers' `LlamaConfig` field names and defaults, with
the options of Mistral (sliding window), Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMSNorm,
a `head_dim` of its own) as fields."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from zoo.configs import ConfigError, positive
from zoo.models.decoder import AttentionSpec, DecoderSpec, MLPSpec, Names
from zoo.models.language import LanguageModelConfig, decoder_sizes

_LLAMA3_ROPE = {"rope_theta": 500000.0, "rope_type": "llama3", "rope_factor": 32.0,
                "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
                "rope_original_max_position_embeddings": 8192}
_LLAMA3 = {"vocab_size": 128256, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
           **_LLAMA3_ROPE}
_QWEN = {"vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0}
_QWEN2 = {**_QWEN, "model_type": "qwen2", "qkv_bias": True}
_QWEN3 = {**_QWEN, "model_type": "qwen3", "qk_norm": True, "head_dim": 128,
          "max_position_embeddings": 40960}


# The published config.json files (tests/fixtures/hf_configs/ holds them; each named model is
# pinned there to transformers' keys, shapes and parameter count).
NAMED_MODELS: dict[str, dict[str, Any]] = {
    "llama-2-7b": {**decoder_sizes(4096, 11008, 32, 32, 32), "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 4096},
    "llama-3.2-1b": {**_LLAMA3, **decoder_sizes(2048, 8192, 16, 32, 8), "head_dim": 64,
                     "tie_word_embeddings": True},
    "llama-3.2-3b": {**_LLAMA3, **decoder_sizes(3072, 8192, 28, 24, 8), "head_dim": 128,
                     "tie_word_embeddings": True},
    "llama-3.1-8b": {**_LLAMA3, **decoder_sizes(4096, 14336, 32, 32, 8), "rope_factor": 8.0},
    "mistral-7b-v0.1": {**decoder_sizes(4096, 14336, 32, 32, 8), "model_type": "mistral",
                        "rms_norm_eps": 1e-5, "max_position_embeddings": 32768,
                        "sliding_window": 4096},
    "qwen2.5-0.5b": {**_QWEN2, **decoder_sizes(896, 4864, 24, 14, 2), "tie_word_embeddings": True,
                     "max_position_embeddings": 32768},
    "qwen2.5-1.5b": {**_QWEN2, **decoder_sizes(1536, 8960, 28, 12, 2), "tie_word_embeddings": True,
                     "max_position_embeddings": 131072},
    "qwen2.5-7b": {**_QWEN2, **decoder_sizes(3584, 18944, 28, 28, 4), "vocab_size": 152064,
                   "max_position_embeddings": 131072},
    "qwen3-0.6b": {**_QWEN3, **decoder_sizes(1024, 3072, 28, 16, 8), "tie_word_embeddings": True},
    "qwen3-1.7b": {**_QWEN3, **decoder_sizes(2048, 6144, 28, 16, 8), "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3, **decoder_sizes(4096, 12288, 36, 32, 8)},
}

NAMES = Names(body="model", embedding="embed_tokens", layers="layers", norm="norm",
              block=(("self_attn", "attention"), ("mlp", "mlp"),
                     ("input_layernorm", "attention_norm"),
                     ("post_attention_layernorm", "mlp_norm")))

_INDEX = "model.safetensors.index.json"  # a sharded release
# The releases on the Hub (zoo.create("qwen3-0.6b.base", impl, pretrained=True)); meta-llama's
# repositories are gated: the Hub serves them to an accepted licence's token only.
HUB_REPOS: dict[str, dict[str, Any]] = {
    name: {"base": {"hub": repo, "license": licence,
                    **({"file": _INDEX} if sharded else {})}}
    for name, (repo, licence, sharded) in {
        "llama-2-7b": ("meta-llama/Llama-2-7b-hf", "llama2", True),
        "llama-3.2-1b": ("meta-llama/Llama-3.2-1B", "llama3.2", False),
        "llama-3.2-3b": ("meta-llama/Llama-3.2-3B", "llama3.2", True),
        "llama-3.1-8b": ("meta-llama/Llama-3.1-8B", "llama3.1", True),
        "mistral-7b-v0.1": ("mistralai/Mistral-7B-v0.1", "apache-2.0", True),
        "qwen2.5-0.5b": ("Qwen/Qwen2.5-0.5B", "apache-2.0", False),
        "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B", "apache-2.0", False),
        "qwen2.5-7b": ("Qwen/Qwen2.5-7B", "apache-2.0", True),
        "qwen3-0.6b": ("Qwen/Qwen3-0.6B", "apache-2.0", False),
        "qwen3-1.7b": ("Qwen/Qwen3-1.7B", "apache-2.0", True),
        "qwen3-8b": ("Qwen/Qwen3-8B", "apache-2.0", True)}.items()}

@dataclass(frozen=True)
class LlamaConfig(LanguageModelConfig):
    """transformers' `LlamaForCausalLM` and its relatives, through fields rather than classes:
    `model.embed_tokens`, decoder layers (`input_layernorm`, `self_attn.{q,k,v,o}_proj`,
    `post_attention_layernorm`, SwiGLU `mlp.{gate,up,down}_proj`), `model.norm` and `lm_head`
    (absent when `tie_word_embeddings`). RMSNorms as transformers' (float32 statistics); the
    rotary embedding in transformers' half-split convention, `rope_theta`, and Llama 3's
    rescaled frequencies (`rope_type="llama3"` with `rope_factor`, `rope_low_freq_factor`,
    `rope_high_freq_factor`, `rope_original_max_position_embeddings`: transformers'
    `rope_scaling` entries); grouped-query attention (`num_key_value_heads`, None: one per
    head); `head_dim` (None: `hidden_size / num_attention_heads`).

    The relatives' options: `sliding_window` (Mistral: a query sees the last `sliding_window`
    tokens; None: all), `attention_bias` (Llama's: biases on q, k, v and o), `qkv_bias`
    (Qwen2's: on q, k and v only), `mlp_bias` (Llama's), `qk_norm` (Qwen3's per-head RMSNorm
    `self_attn.q_norm` / `k_norm` over `head_dim`, before the rotary embedding). `model_type`
    says which transformers class a written `config.json` names (its options must be ones that
    class has); `seq_len` (the zoo's) is the length of the examples.
    """

    arch: ClassVar[str] = "llama"
    REFERENCES: ClassVar[dict[str, str]] = {
        "transformers' Llama, Mistral, Qwen2 and Qwen3": "tests/test_language_models.py",
        "the published config.json files, parameter counts": "tests/test_named_language_models.py",
        "transformers' `save_pretrained` folders": "tests/test_hf_language_models.py",
    }
    EMBEDDING: ClassVar[str] = "model.embed_tokens.weight"
    # Grouped-query attention and Llama 3's rope scaling (a wavelength in each of its three
    # bands at this head size), untied.
    TINY: ClassVar[dict[str, Any]] = {
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "rope_theta": 500000.0, "rope_type": "llama3", "rope_factor": 8.0,
        "rope_original_max_position_embeddings": 256, "seq_len": 8}
    # No VARIANTS: the registry-wide tests run the tiny config; every option (sliding window,
    # biases, q/k norm, own head size, tied head) is checked against transformers in
    # tests/test_language_models.py, which costs the suite less than a registry variant.
    NAMED: ClassVar[dict[str, dict[str, Any]]] = NAMED_MODELS
    HUB_REPOS: ClassVar[dict[str, dict[str, Any]]] = HUB_REPOS
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: Literal["default", "llama3"] = "default"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qkv_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    model_type: Literal["llama", "mistral", "qwen2", "qwen3"] = "llama"
    seq_len: int | None = None  # the examples' length (None: 128, or fewer positions)

    def __post_init__(self) -> None:
        if self.rope_type == "default":  # Llama 3's fields unused: equal functions, equal configs
            for f in _LLAMA3_FIELDS:
                object.__setattr__(self, f.name, f.default)
        super().__post_init__()

    def validate(self) -> None:
        positive("llama sizes", (self.vocab_size, self.hidden_size, self.intermediate_size,
                                 self.num_hidden_layers, self.num_attention_heads,
                                 self.max_position_embeddings))
        for name in ("num_key_value_heads", "head_dim", "sliding_window"):
            if getattr(self, name) is not None:
                positive(f"llama.{name}", (getattr(self, name),))
        if self.num_attention_heads % self.kv_heads:
            raise ConfigError(f"llama.num_attention_heads {self.num_attention_heads} must be a "
                              f"multiple of num_key_value_heads {self.kv_heads}")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"llama.hidden_size {self.hidden_size} must be a multiple of "
                              f"num_attention_heads {self.num_attention_heads} (or set "
                              "head_dim)")
        if self.dim % 2:
            raise ConfigError(f"llama: the rotary embedding needs an even head_dim, found "
                              f"{self.dim}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ConfigError("llama.rms_norm_eps and rope_theta must be positive")
        if self.rope_type == "llama3" and not (
                self.rope_factor > 0 and self.rope_high_freq_factor > self.rope_low_freq_factor > 0
                and self.rope_original_max_position_embeddings > 0):
            raise ConfigError("llama: rope_type 'llama3' needs rope_factor > 0 and "
                              "rope_high_freq_factor > rope_low_freq_factor > 0")
        self.check_lengths()

    @property
    def kv_heads(self) -> int:
        """Key/value heads (grouped-query attention)."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def dim(self) -> int:
        """The size of each head (`head_dim`, else `hidden_size / num_attention_heads`)."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def qkv_biased(self) -> bool:
        return self.attention_bias or self.qkv_bias

    def rope(self) -> np.ndarray:
        """The rotary inverse frequencies `(dim / 2,)`, float32, as transformers'."""
        from zoo.layers.causal import rope_frequencies

        return rope_frequencies(
            self.dim, self.rope_theta, self.rope_type, self.rope_factor,
            self.rope_low_freq_factor, self.rope_high_freq_factor,
            self.rope_original_max_position_embeddings)

    @property
    def decoder(self) -> DecoderSpec:
        """The shared decoder body's options: RMSNorm, `q/k/v/o_proj` with grouped key/value
        heads (biases, q/k norm, sliding window), SwiGLU MLP, rotary positions."""
        return DecoderSpec(
            NAMES, self.vocab_size, self.hidden_size, self.num_hidden_layers, "rms_norm",
            self.rms_norm_eps,
            AttentionSpec("qkvo", self.num_attention_heads, self.kv_heads, self.dim,
                          qkv_bias=self.qkv_biased, out_bias=self.attention_bias,
                          qk_norm=self.qk_norm, sliding_window=self.sliding_window),
            MLPSpec("gated", self.intermediate_size, "silu", bias=self.mlp_bias),
            rope=tuple(float(f) for f in self.rope()),
            tie_word_embeddings=self.tie_word_embeddings)


_LLAMA3_FIELDS = [f for f in dataclasses.fields(LlamaConfig)
                  if f.name in ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                                "rope_original_max_position_embeddings")]
