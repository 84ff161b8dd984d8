"""The Phi-3 family's configuration: transformers' `Phi3Config` field names and defaults
(Phi-3 mini and medium, Phi-3.5 mini): Llama's arithmetic with the attention's queries, keys and
values in one `qkv_proj` and the MLP's gate and up projections in one `gate_up_proj`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zoo.configs import ConfigError, positive
from zoo.models.decoder import AttentionSpec, DecoderSpec, MLPSpec, Names
from zoo.models.language import LanguageModelConfig

_PHI3 = {"vocab_size": 32064, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
         "sliding_window": 2047}

# The published config.json files (tests/fixtures/hf_configs/ holds them; each named model is
# pinned there to transformers' keys, shapes and parameter count). The 128k-context releases
# (Phi-3-mini-128k, Phi-3.5-mini) scale their rotary embedding with "longrope", which the zoo
# refuses (converters/adapters/hf_phi3.py): they are not named here.
NAMED_MODELS: dict[str, dict[str, Any]] = {
    "phi-3-mini-4k": {**_PHI3, "hidden_size": 3072, "intermediate_size": 8192,
                      "num_hidden_layers": 32, "num_attention_heads": 32,
                      "num_key_value_heads": 32},
    "phi-3-medium-4k": {**_PHI3, "hidden_size": 5120, "intermediate_size": 17920,
                        "num_hidden_layers": 40, "num_attention_heads": 40,
                        "num_key_value_heads": 10},
}

NAMES = Names(body="model", embedding="embed_tokens", layers="layers", norm="norm",
              block=(("self_attn", "attention"), ("mlp", "mlp"),
                     ("input_layernorm", "attention_norm"),
                     ("post_attention_layernorm", "mlp_norm")))

# The releases on the Hub (zoo.create("phi-3-mini-4k.instruct", impl, pretrained=True)).
HUB_REPOS: dict[str, dict[str, Any]] = {
    name: {"instruct": {"hub": repo, "license": "mit", "file": "model.safetensors.index.json"}}
    for name, repo in {"phi-3-mini-4k": "microsoft/Phi-3-mini-4k-instruct",
                       "phi-3-medium-4k": "microsoft/Phi-3-medium-4k-instruct"}.items()}


@dataclass(frozen=True)
class Phi3Config(LanguageModelConfig):
    """transformers' `Phi3ForCausalLM`: `model.embed_tokens`, decoder layers
    (`input_layernorm`, `self_attn.qkv_proj` (queries, keys, values stacked along its output),
    `self_attn.o_proj`, `post_attention_layernorm`, SwiGLU `mlp.gate_up_proj` (gate, then up)
    and `mlp.down_proj`), `model.norm` and `lm_head` (absent when `tie_word_embeddings`).
    RMSNorms as transformers' (float32 statistics); grouped-query attention
    (`num_key_value_heads`, None: one per head); the rotary embedding of base `rope_theta` on
    the first `partial_rotary_factor * head_dim` dimensions of each head (transformers'
    partial rotary; 1.0: all); `sliding_window` (a query sees the last `sliding_window`
    tokens; None: all); dropout on each branch's output before the residual (`resid_pdrop`)
    and on the attention weights (`attention_dropout`), in training. `seq_len` (the zoo's) is
    the length of the examples.
    """

    arch: ClassVar[str] = "phi3"
    REFERENCES: ClassVar[dict[str, str]] = {
        "transformers' Phi-3": "tests/test_language_models.py",
        "the published config.json files, parameter counts": "tests/test_named_language_models.py",
        "transformers' `save_pretrained` folders": "tests/test_hf_language_models.py",
    }
    EMBEDDING: ClassVar[str] = "model.embed_tokens.weight"
    # Grouped-query attention, untied (the variants in tests/lm_reference.py add a sliding
    # window, partial rotary and a tied head).
    TINY: ClassVar[dict[str, Any]] = {
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "seq_len": 8}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = NAMED_MODELS
    HUB_REPOS: ClassVar[dict[str, dict[str, Any]]] = HUB_REPOS
    vocab_size: int = 32064
    hidden_size: int = 3072
    intermediate_size: int = 8192
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    resid_pdrop: float = 0.0
    attention_dropout: float = 0.0
    seq_len: int | None = None  # the examples' length (None: 128, or fewer positions)

    def validate(self) -> None:
        positive("phi3 sizes", (self.vocab_size, self.hidden_size, self.intermediate_size,
                                self.num_hidden_layers, self.num_attention_heads,
                                self.max_position_embeddings))
        for name in ("num_key_value_heads", "sliding_window"):
            if getattr(self, name) is not None:
                positive(f"phi3.{name}", (getattr(self, name),))
        if self.num_attention_heads % self.kv_heads:
            raise ConfigError(f"phi3.num_attention_heads {self.num_attention_heads} must be a "
                              f"multiple of num_key_value_heads {self.kv_heads}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"phi3.hidden_size {self.hidden_size} must be a multiple of "
                              f"num_attention_heads {self.num_attention_heads}")
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2 or not self.rotary_dim:
            raise ConfigError(f"phi3.partial_rotary_factor {self.partial_rotary_factor!r} must "
                              f"be in (0, 1] and rotate an even number of a head's "
                              f"{self.head_dim} dimensions (found {self.rotary_dim})")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ConfigError("phi3.rms_norm_eps and rope_theta must be positive")
        for name in ("resid_pdrop", "attention_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"phi3.{name} must be in [0, 1), found {getattr(self, name)!r}")
        self.check_lengths()

    @property
    def kv_heads(self) -> int:
        """Key/value heads (grouped-query attention)."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        """The rotated dimensions of each head, as transformers rounds them."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def decoder(self) -> DecoderSpec:
        """The shared decoder body's options: RMSNorm, the fused `qkv_proj` with grouped
        key/value heads (sliding window, attention dropout), the fused SwiGLU `gate_up_proj`,
        rotary positions on `rotary_dim` dimensions, residual dropout."""
        from zoo.layers.causal import rope_frequencies

        rope = rope_frequencies(self.rotary_dim, self.rope_theta)
        return DecoderSpec(
            NAMES, self.vocab_size, self.hidden_size, self.num_hidden_layers, "rms_norm",
            self.rms_norm_eps,
            AttentionSpec("qkv_proj", self.num_attention_heads, self.kv_heads, self.head_dim,
                          sliding_window=self.sliding_window, dropout=self.attention_dropout),
            MLPSpec("gate_up", self.intermediate_size, "silu"),
            rope=tuple(float(f) for f in rope), residual_dropout=self.resid_pdrop,
            tie_word_embeddings=self.tie_word_embeddings)
