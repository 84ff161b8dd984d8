"""What the Hugging Face `transformers` layouts and `config.json` readers share: the fields
that do not change the eval-mode function, the activations' names, the image size."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.configs import ConfigError

# config.json fields with no effect on the eval-mode function (training, labels, bookkeeping,
# the backbone API's stage selection)
INERT = frozenset({
    "architectures", "attention_probs_dropout_prob", "hidden_dropout_prob", "attention_dropout",
    "dropout", "drop_path_rate", "dtype", "torch_dtype", "initializer_range",
    "initializer_factor", "label2id", "id2label", "num_labels", "model_type",
    "transformers_version", "_name_or_path", "encoder_stride", "return_dict",
    "output_hidden_states", "output_attentions", "problem_type", "chunk_size_feed_forward",
    "is_encoder_decoder", "out_features", "out_indices", "stage_names", "_out_features",
    "_out_indices", "reshape_hidden_states", "apply_layernorm", "use_mask_token",
    "projection_dim", "tie_word_embeddings", "torchscript"})
# transformers' activation names -> the zoo's (`act_layer`)
ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
               "quick_gelu": "quick_gelu", "silu": "silu", "swish": "silu"}
# a headless `transformers` model's pooler: a dense layer and tanh on the class token, which
# timm's ViT has not (the zoo's output is the class token's features, HF's
# `last_hidden_state[:, 0]` after the final norm)
POOLER = "the pooler (tanh(dense(class token))), which timm's ViT has not"


def fields(raw: Mapping[str, Any], where: str, family: str, defaults: Mapping[str, Any],
           inert: frozenset[str] = INERT) -> dict[str, Any]:
    """`raw` over `defaults` (transformers' own for absent fields); ConfigError naming every
    field the zoo has no counterpart for."""
    unknown = sorted(set(raw) - inert - set(defaults))
    if unknown:
        raise ConfigError(f"{where}: {family} config field(s) {', '.join(unknown)} have no "
                          "counterpart in the zoo")
    return {**defaults, **raw}


def activation(name: str, where: str, family: str) -> str:
    if name not in ACTIVATIONS:
        raise ConfigError(f"{where}: hidden_act {name!r}: the zoo's {family} takes "
                          f"{', '.join(map(repr, ACTIVATIONS))}")
    return ACTIVATIONS[name]


def pair(value: Any) -> tuple[int, int]:
    """An image or patch size given as an int or a pair."""
    return (value, value) if isinstance(value, int) else tuple(value)


def classes(raw: Mapping[str, Any]) -> int:
    """The classifier's size: 0 for a headless model (`architectures` given, none of them
    `...ForImageClassification`), else `num_labels` (or the labels listed, or 2, as
    transformers)."""
    architectures = raw.get("architectures")
    if architectures and not any(a.endswith("ForImageClassification") for a in architectures):
        return 0
    return raw.get("num_labels", len(raw.get("id2label") or {}) or 2)
