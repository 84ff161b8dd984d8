"""GPT-2's configuration: transformers' `GPT2Config` field names and defaults (the 124M model,
`gpt2`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from zoo.configs import ConfigError, positive
from zoo.models.decoder import AttentionSpec, DecoderSpec, MLPSpec, Names
from zoo.models.language import LanguageModelConfig

# OpenAI's four sizes as transformers' `openai-community/gpt2*` config.json files give them
# (fixtures in tests/fixtures/hf_configs/; `gpt2` itself is the defaults).
_SIZES = {"gpt2-medium": (1024, 24, 16), "gpt2-large": (1280, 36, 20), "gpt2-xl": (1600, 48, 25)}
NAMES = Names(body="transformer", embedding="wte", positions="wpe", layers="h",
              norm="ln_f", block=(("ln_1", "attention_norm"), ("attn", "attention"),
                                  ("ln_2", "mlp_norm"), ("mlp", "mlp")))


@dataclass(frozen=True)
class GPT2Config(LanguageModelConfig):
    """transformers' `GPT2LMHeadModel`: token and learned position embeddings (`wte`, `wpe`),
    pre-LayerNorm blocks (`ln_1`, fused q/k/v `attn.c_attn` and `attn.c_proj`, `ln_2`, MLP
    `mlp.c_fc` / `mlp.c_proj` with `activation_function`), the final `ln_f`, and the head tied
    to `wte` (`tie_word_embeddings`; untied: a bias-free `lm_head`). The projections are
    transformers' `Conv1D`, weights stored `(in, out)` (layer kind `hf_conv1d`). Dropout after
    the embeddings (`embd_pdrop`), on the attention weights (`attn_pdrop`) and after each
    residual branch (`resid_pdrop`), in training only. `seq_len` (the zoo's) is the length of
    the examples, at most `n_positions`.
    """

    arch: ClassVar[str] = "gpt2"
    REFERENCES: ClassVar[dict[str, str]] = {
        "transformers' GPT-2": "tests/test_language_models.py",
        "the published config.json files, parameter counts": "tests/test_named_language_models.py",
        "transformers' `save_pretrained` folders": "tests/test_hf_language_models.py",
    }
    EMBEDDING: ClassVar[str] = "transformer.wte.weight"
    TINY: ClassVar[dict[str, Any]] = {"vocab_size": 96, "n_positions": 16, "n_embd": 16,
                                      "n_layer": 2, "n_head": 2, "embd_pdrop": 0.0,
                                      "attn_pdrop": 0.0, "resid_pdrop": 0.0, "seq_len": 8}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = {
        name: {"n_embd": e, "n_layer": n, "n_head": h} for name, (e, n, h) in _SIZES.items()}
    # OpenAI's releases on the Hub (zoo.create("gpt2-medium.openai", impl, pretrained=True)).
    HUB_REPOS: ClassVar[dict[str, dict[str, Any]]] = {
        name: {"openai": {"hub": f"openai-community/{name}", "license": "mit"}}
        for name in ("gpt2", *_SIZES)}
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None  # the MLP's width; None: 4 * n_embd
    activation_function: Literal["gelu_new", "gelu_pytorch_tanh", "gelu", "relu"] = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    tie_word_embeddings: bool = True
    seq_len: int | None = None  # the examples' length (None: 128, or fewer positions)

    def validate(self) -> None:
        positive("gpt2 sizes", (self.vocab_size, self.n_positions, self.n_embd, self.n_layer,
                                self.n_head))
        if self.n_inner is not None:
            positive("gpt2.n_inner", (self.n_inner,))
        if self.n_embd % self.n_head:
            raise ConfigError(f"gpt2.n_embd {self.n_embd} must be a multiple of n_head "
                              f"{self.n_head}")
        for name in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"gpt2.{name} must be in [0, 1), found {getattr(self, name)}")
        if not self.layer_norm_epsilon > 0:
            raise ConfigError(f"gpt2.layer_norm_epsilon must be positive, found "
                              f"{self.layer_norm_epsilon}")
        self.check_lengths()

    @property
    def max_length(self) -> int:
        return self.n_positions

    @property
    def inner(self) -> int:
        """The MLP's width."""
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def dropout(self) -> float:
        """The largest dropout rate (a training step draws a dropout key when positive)."""
        return max(self.embd_pdrop, self.attn_pdrop, self.resid_pdrop)

    @property
    def decoder(self) -> DecoderSpec:
        """The shared decoder body's options: LayerNorm, fused `c_attn`, GELU MLP `c_fc`,
        learned positions, dropout."""
        return DecoderSpec(
            NAMES, self.vocab_size, self.n_embd, self.n_layer, "layer_norm",
            self.layer_norm_epsilon,
            AttentionSpec("c_attn", self.n_head, self.n_head, self.head_dim, qkv_bias=True,
                          out_bias=True, dropout=self.attn_pdrop),
            MLPSpec("c_fc", self.inner, self.activation_function, bias=True),
            max_positions=self.n_positions, embedding_dropout=self.embd_pdrop,
            residual_dropout=self.resid_pdrop, tie_word_embeddings=self.tie_word_embeddings)
