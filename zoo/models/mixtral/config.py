"""The mixture-of-experts family's configuration: transformers' `MixtralConfig` field names and
defaults, with Qwen3-MoE's options (per-head q/k RMSNorm, a `head_dim` of its own, the experts'
own width, dense layers among the sparse ones, top-k weights not renormalised) as fields;
`model_type` says which transformers class a written `config.json` names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from zoo.configs import ConfigError, positive
from zoo.models.decoder import AttentionSpec, DecoderSpec, MLPSpec, MoESpec, Names
from zoo.models.language import INITIALIZER_RANGE, LanguageModelConfig, decoder_sizes

_MIXTRAL = {"vocab_size": 32000, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
            "num_local_experts": 8, "num_experts_per_tok": 2}
_QWEN3_MOE = {"model_type": "qwen3_moe", "vocab_size": 151936, "rms_norm_eps": 1e-6,
              "rope_theta": 1e6, "qk_norm": True, "head_dim": 128, "num_local_experts": 128,
              "num_experts_per_tok": 8, "norm_topk_prob": True, "router_aux_loss_coef": 0.001,
              "max_position_embeddings": 40960}


# The published config.json files (tests/fixtures/hf_configs/ holds them; each named model is
# pinned there to transformers' keys, shapes and parameter count).
NAMED_MODELS: dict[str, dict[str, Any]] = {
    "mixtral-8x7b-v0.1": {**_MIXTRAL, **decoder_sizes(4096, 14336, 32, 32, 8),
                          "max_position_embeddings": 32768, "router_aux_loss_coef": 0.02},
    "mixtral-8x22b-v0.1": {**_MIXTRAL, **decoder_sizes(6144, 16384, 56, 48, 8),
                           "max_position_embeddings": 65536, "router_aux_loss_coef": 0.001},
    "qwen3-30b-a3b": {**_QWEN3_MOE, **decoder_sizes(2048, 6144, 48, 32, 4),
                      "moe_intermediate_size": 768},
    "qwen3-235b-a22b": {**_QWEN3_MOE, **decoder_sizes(4096, 12288, 94, 64, 4),
                        "moe_intermediate_size": 1536},
}

_INDEX = "model.safetensors.index.json"  # every release is sharded
HUB_REPOS: dict[str, dict[str, Any]] = {
    "mixtral-8x7b-v0.1": {
        "base": {"hub": "mistralai/Mixtral-8x7B-v0.1", "license": "apache-2.0", "file": _INDEX},
        "instruct": {"hub": "mistralai/Mixtral-8x7B-Instruct-v0.1", "license": "apache-2.0",
                     "file": _INDEX}},
    "mixtral-8x22b-v0.1": {"base": {"hub": "mistralai/Mixtral-8x22B-v0.1",
                                    "license": "apache-2.0", "file": _INDEX}},
    "qwen3-30b-a3b": {"base": {"hub": "Qwen/Qwen3-30B-A3B", "license": "apache-2.0",
                               "file": _INDEX}},
    "qwen3-235b-a22b": {"base": {"hub": "Qwen/Qwen3-235B-A22B", "license": "apache-2.0",
                                 "file": _INDEX}},
}

# transformers' definition order: Mixtral's block defines the router first, Qwen3-MoE's last.
NAMES = Names(body="model", embedding="embed_tokens", layers="layers", norm="norm",
              block=(("self_attn", "attention"), ("mlp", "mlp"),
                     ("input_layernorm", "attention_norm"),
                     ("post_attention_layernorm", "mlp_norm")))
ROUTER_FIRST = {"mixtral": True, "qwen3_moe": False}


def normal_experts(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator
                   ) -> dict[str, np.ndarray]:
    """transformers' `_init_weights` of the fused experts: N(0, initializer_range)."""
    return {k: INITIALIZER_RANGE * rng.standard_normal(s) for k, s in shapes.items()}


@dataclass(frozen=True)
class MixtralConfig(LanguageModelConfig):
    """transformers' `MixtralForCausalLM` and `Qwen3MoeForCausalLM` through fields: the Llama
    body (`model.embed_tokens`, `input_layernorm`, `self_attn.{q,k,v,o}_proj` with grouped
    key/value heads and the rotary embedding, `post_attention_layernorm`, `model.norm`,
    `lm_head`) whose MLP is a sparse mixture of experts: `mlp.gate` (the router, a Linear
    without bias: softmax, the `num_experts_per_tok` most probable of `num_local_experts`
    experts, their probabilities renormalised to sum 1 when `norm_topk_prob`) and
    `mlp.experts` (SwiGLU experts, transformers' fused `gate_up_proj` `(E, 2 * width,
    hidden)` and `down_proj` `(E, hidden, width)`).

    Qwen3-MoE's options: `qk_norm` (per-head `q_norm` / `k_norm`), `head_dim`,
    `moe_intermediate_size` (the experts' width; None: `intermediate_size`, Mixtral's), the
    dense SwiGLU layers of width `intermediate_size`: those in `mlp_only_layers` and those
    whose number `i + 1` is not a multiple of `decoder_sparse_step`. `router_aux_loss_coef`
    weights the load-balancing loss; with `output_router_logits` the model returns `(logits,
    router_logits)` and `zoo.runtime.training.router_loss` adds it to the loss, as transformers'
    `labels=` loss with `output_router_logits=True`. `dispatch` (the zoo's): `sorted` (tokens
    grouped by expert) or `dense` (every expert on every token, the reference); `seq_len` (the
    zoo's) the examples' length.
    """

    arch: ClassVar[str] = "mixtral"
    REFERENCES: ClassVar[dict[str, str]] = {
        "transformers' Mixtral and Qwen3-MoE": "tests/test_language_models.py",
        "transformers' load-balancing loss, the two dispatches": "tests/test_moe.py",
        "the published config.json files, parameter counts": "tests/test_named_language_models.py",
        "transformers' `save_pretrained` folders": "tests/test_hf_language_models.py",
    }
    EMBEDDING: ClassVar[str] = "model.embed_tokens.weight"
    KIND_INITS: ClassVar[dict[str, Any]] = {**LanguageModelConfig.KIND_INITS,
                                            "experts": normal_experts}
    # 4 experts, top 2, grouped-query attention, untied (tests/lm_reference.py adds Qwen3-MoE's)
    TINY: ClassVar[dict[str, Any]] = {
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "num_local_experts": 4, "num_experts_per_tok": 2, "seq_len": 8}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = NAMED_MODELS
    HUB_REPOS: ClassVar[dict[str, dict[str, Any]]] = HUB_REPOS
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    max_position_embeddings: int = 131072
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    norm_topk_prob: bool = True
    moe_intermediate_size: int | None = None
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.001
    output_router_logits: bool = False
    model_type: Literal["mixtral", "qwen3_moe"] = "mixtral"
    dispatch: Literal["sorted", "dense"] = "sorted"
    seq_len: int | None = None  # the examples' length (None: 128)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        super().__post_init__()

    def validate(self) -> None:
        positive("mixtral sizes", (self.vocab_size, self.hidden_size, self.intermediate_size,
                                   self.num_hidden_layers, self.num_attention_heads,
                                   self.num_key_value_heads, self.max_position_embeddings,
                                   self.num_local_experts, self.num_experts_per_tok,
                                   self.decoder_sparse_step))
        for name in ("head_dim", "sliding_window", "moe_intermediate_size"):
            if getattr(self, name) is not None:
                positive(f"mixtral.{name}", (getattr(self, name),))
        if self.num_experts_per_tok > self.num_local_experts:
            raise ConfigError(f"mixtral.num_experts_per_tok {self.num_experts_per_tok} exceeds "
                              f"num_local_experts {self.num_local_experts}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"mixtral.num_attention_heads {self.num_attention_heads} must be "
                              f"a multiple of num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"mixtral.hidden_size {self.hidden_size} must be a multiple of "
                              f"num_attention_heads {self.num_attention_heads} (or set "
                              "head_dim)")
        if self.dim % 2:
            raise ConfigError(f"mixtral: the rotary embedding needs an even head_dim, found "
                              f"{self.dim}")
        bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ConfigError(f"mixtral.mlp_only_layers {bad} are not layers 0 .. "
                              f"{self.num_hidden_layers - 1}")
        if not self.sparse_layers:
            raise ConfigError("mixtral: no layer has experts (mlp_only_layers and "
                              "decoder_sparse_step leave every layer dense)")
        if not (self.rms_norm_eps > 0 and self.rope_theta > 0 and self.router_aux_loss_coef >= 0):
            raise ConfigError("mixtral.rms_norm_eps and rope_theta must be positive, "
                              "router_aux_loss_coef not negative")
        self.check_lengths()

    @property
    def dim(self) -> int:
        """The size of each head (`head_dim`, else `hidden_size / num_attention_heads`)."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        """The layers whose MLP is the mixture (transformers' rule)."""
        return tuple(i for i in range(self.num_hidden_layers)
                     if i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0)

    @property
    def decoder(self) -> DecoderSpec:
        """The shared decoder body's options: RMSNorm, `q/k/v/o_proj` with grouped key/value
        heads (q/k norm, sliding window), rotary positions, per layer the mixture of experts
        (`moe`) or, for dense layers, a SwiGLU MLP."""
        from zoo.layers.causal import rope_frequencies

        moe = MLPSpec("moe", self.moe_intermediate_size or self.intermediate_size, "silu",
                      moe=MoESpec(self.num_local_experts, self.num_experts_per_tok,
                                  self.norm_topk_prob, self.dispatch,
                                  ROUTER_FIRST[self.model_type]))
        dense = MLPSpec("gated", self.intermediate_size, "silu")
        sparse = set(self.sparse_layers)
        mlps = tuple(moe if i in sparse else dense for i in range(self.num_hidden_layers))
        return DecoderSpec(
            NAMES, self.vocab_size, self.hidden_size, self.num_hidden_layers, "rms_norm",
            self.rms_norm_eps,
            AttentionSpec("qkvo", self.num_attention_heads, self.num_key_value_heads, self.dim,
                          qkv_bias=self.attention_bias, out_bias=self.attention_bias,
                          qk_norm=self.qk_norm, sliding_window=self.sliding_window),
            moe, rope=tuple(float(f) for f in rope_frequencies(self.dim, self.rope_theta)),
            tie_word_embeddings=self.tie_word_embeddings,
            layer_mlps=None if len(sparse) == self.num_hidden_layers else mlps,
            output_router_logits=self.output_router_logits)
