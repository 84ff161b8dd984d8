"""`transformers` references for the language-model tests: small configs of every variant of
the zoo's GPT-2, Llama, Gemma, Phi-3 and mixture-of-experts families, the `transformers` model
of a zoo config (built from the `config.json` the zoo writes, eager attention, float32, random
weights with every array perturbed), and left-padded batches."""

from __future__ import annotations

import functools

import numpy as np

import zoo
from zoo.layers.causal import positions
from zoo.models.gemma.config import GEMMA2, GEMMA3, pattern

# Every option of the list, each in a small config (two layers of width 16-32).
_ROPE = {"rope_type": "default", "rope_theta": 1e6}
_GEMMA2 = {"model_type": GEMMA2["model_type"], "post_norms": True}
_GEMMA3 = {k: v for k, v in GEMMA3.items() if k not in ("vocab_size", "max_position_embeddings")}
VARIANTS: dict[str, zoo.Config] = {
    "gpt2": zoo.tiny_config("gpt2"),  # tied
    "gpt2-untied": zoo.tiny_config("gpt2", tie_word_embeddings=False, n_inner=24),
    # grouped-query attention and Llama 3's rope scaling (zoo's TINY), untied; Llama's MLP bias
    "llama-gqa-rope3": zoo.tiny_config("llama", mlp_bias=True),
    "mistral-window": zoo.tiny_config("llama", rope_type="default", model_type="mistral",
                                      sliding_window=3),
    "qwen2-bias-tied": zoo.tiny_config("llama", **_ROPE, model_type="qwen2", qkv_bias=True,
                                       tie_word_embeddings=True),
    # Qwen3: q/k norm, its own head size; as Qwen3-0.6B tied, with Qwen3's optional biases
    "qwen3-norm-head-dim": zoo.tiny_config("llama", **_ROPE, model_type="qwen3", qk_norm=True,
                                           head_dim=12, tie_word_embeddings=True,
                                           attention_bias=True),
    # Gemma 1: (1 + weight) norms, scaled embeddings, GeGLU, grouped-query attention, tied
    "gemma-tied": zoo.tiny_config("gemma"),
    # Gemma 2: post-norms, scale from query_pre_attn_scalar, soft-capped scores and logits
    # (caps small enough to bite), sliding / full / sliding layers, untied
    "gemma2-softcap-window": zoo.tiny_config("gemma", **_GEMMA2, num_hidden_layers=3,
                                             query_pre_attn_scalar=12,
                                             attn_logit_softcapping=2.0,
                                             final_logit_softcapping=3.0, sliding_window=3,
                                             layer_types=pattern(3, 2),
                                             tie_word_embeddings=False),
    # Gemma 3 text: q/k norms, the local layers' own rotary base, the global ones' linear
    # scaling (factor 8), sliding / full / sliding layers, tied
    "gemma3-qk-norm-local-rope": zoo.tiny_config("gemma", **_GEMMA3, num_hidden_layers=3,
                                                 rope_type="linear", rope_factor=8.0,
                                                 sliding_window=3, layer_types=pattern(3, 2),
                                                 query_pre_attn_scalar=16),
    # Phi-3: fused qkv_proj (grouped: q, k, v of unequal widths) and gate_up_proj, a sliding
    # window, untied; then half of each head rotated (partial rotary), tied
    "phi3-gqa-window": zoo.tiny_config("phi3", sliding_window=3),
    "phi3-partial-rope-tied": zoo.tiny_config("phi3", partial_rotary_factor=0.5,
                                              rope_theta=100.0, tie_word_embeddings=True),
    # Mixtral: 4 experts, top 2 (renormalised), grouped-query attention, untied
    "mixtral-moe": zoo.tiny_config("mixtral"),
    # Qwen3-MoE: q/k norms, own head and expert sizes, a dense layer between two sparse ones,
    # top-k weights not renormalised, tied
    "qwen3-moe-dense-layer": zoo.tiny_config("mixtral", model_type="qwen3_moe", qk_norm=True,
                                             head_dim=12, num_hidden_layers=3,
                                             moe_intermediate_size=16, mlp_only_layers=(1,),
                                             norm_topk_prob=False, tie_word_embeddings=True),
}
PADDING = (0, 3, 1)  # left padding of each row of the batch
QUICK = "llama-gqa-rope3"  # the variant `--quick` keeps (the Llama family's tiny config)


def variants() -> list:
    """The variant names as parameters, all but `QUICK` left out of `--quick`."""
    import pytest

    return [n if n == QUICK else pytest.param(n, marks=pytest.mark.full_only)
            for n in VARIANTS]


def hf_config(config: zoo.Config):
    """transformers' config of a zoo config: the `config.json` the zoo writes, read by
    transformers, with eager attention."""
    import transformers

    from converters.adapters import config_readers

    data = config_readers.writer_for(config).hub_config(config)
    hf = transformers.AutoConfig.for_model(**data)
    hf._attn_implementation = "eager"
    return hf


def hf_model(name: str, seed: int = 0):
    """The `transformers` model of variant `name`: random weights, every array perturbed (biases
    and norms would start at 0 and 1), float32, eval mode, eager attention."""
    return hf_model_of(VARIANTS[name], seed)


@functools.cache
def hf_model_of(config: zoo.Config, seed: int = 0):
    """The `transformers` model of a zoo config, as `hf_model` builds it."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # quiet tests: no warnings, no progress bars
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        hf_config(config), attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def hf_state(name: str) -> dict[str, np.ndarray]:
    """The transformers model's `state_dict()` as NumPy arrays (a tied head's `lm_head.weight`
    beside the embedding, as transformers lists it)."""
    return {k: v.numpy().copy() for k, v in hf_model(name).state_dict().items()}


def padded_batch(config: zoo.Config, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(ids, attention_mask, position_ids) of a left-padded batch of `config.length` tokens
    (row i padded by `PADDING[i]`, position ids counted from each row's first token, as
    transformers' `generate` gives them)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, (len(PADDING), config.length)).astype(np.int32)
    mask = np.ones_like(ids)
    for row, pad in enumerate(PADDING):
        mask[row, :pad] = 0
        ids[row, :pad] = 0  # a pad token id
    return ids, mask, np.asarray(positions(mask), np.int32)


def hf_logits(name: str, ids: np.ndarray, mask: np.ndarray | None = None,
              position_ids: np.ndarray | None = None) -> np.ndarray:
    import torch

    kwargs = {} if mask is None else {"attention_mask": torch.from_numpy(mask).long(),
                                      "position_ids": torch.from_numpy(position_ids).long()}
    with torch.no_grad():
        return hf_model(name)(input_ids=torch.from_numpy(ids).long(), **kwargs).logits.numpy()


def relative(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference over the largest magnitude: the issue's "relative" measure."""
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))
