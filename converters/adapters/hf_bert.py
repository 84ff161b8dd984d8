"""transformers' encoders' `config.json`: one `HubReader` per `model_type` (`bert`, `roberta`),
read into the zoo's `bert` config and written back. Their weights need no adapter: the zoo's
canonical names are transformers' own (`bert.` / `roberta.` prefixed, as the heads' models
save them; a `BertModel` / `RobertaModel` file without the prefix is the backbone:
`converters.checkpoints.backbone`, from `Config.backbone_prefix`), and the
masked-LM decoder (`decoder.weight`, `decoder.bias` beside the word
embedding and the head's bias) is the architecture's tie.

The head is the file's `architectures` entry (`...ForMaskedLM`, `...ForSequenceClassification`
with `id2label`'s classes, `...Model`: the hidden states); another head, a relative position
embedding, a decoder or cross-attention is refused by name, as is any field the zoo does not
know (`refuse_fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.config_readers import HubReader, ModelTypeReader
from converters.adapters.hf_lm import build_config, must, refuse_fields
from zoo.configs import Config, ConfigError
from zoo.models.bert.config import BertConfig

_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
           "intermediate_size", "hidden_act", "hidden_dropout_prob",
           "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
           "layer_norm_eps", "pad_token_id", "tie_word_embeddings", "classifier_dropout")
_FIXED = {"position_embedding_type": ("absolute",), "is_decoder": (False,),
          "add_cross_attention": (False,)}
_INERT = {"gradient_checkpointing", "use_cache"}
_HEADS = {"ForMaskedLM": "masked_lm", "ForSequenceClassification": "sequence_classification",
          "Model": "base"}


class EncoderReader(ModelTypeReader):
    """`config.json` of one encoder `model_type` (its transformers class's defaults for
    absent fields), read into and written from the zoo's `bert` config."""

    arch: ClassVar[str] = "bert"
    prefix: ClassVar[str]  # transformers' class names: "Bert", "Roberta"
    defaults: ClassVar[dict[str, Any]]  # transformers' defaults that differ from the zoo's

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        family = f"{self.model_type} ({self.prefix})"
        refuse_fields(raw, {*_FIELDS, *_FIXED, *_INERT}, where, family)
        for field, allowed in _FIXED.items():
            must(raw, field, allowed, where, family)
        values = {**self.defaults, **{k: raw[k] for k in _FIELDS if k in raw}}
        head = self.head(raw, where)
        if head == "sequence_classification":
            values["num_labels"] = len(raw.get("id2label") or {0: 0, 1: 1})
        return build_config(BertConfig, {**values, "head": head,
                                         "model_type": self.model_type}, where)

    def head(self, raw: Mapping[str, Any], where: str) -> str:
        """The zoo's head of the file's `architectures` (none: the masked-LM model)."""
        names = raw.get("architectures") or [f"{self.prefix}ForMaskedLM"]
        heads = {f"{self.prefix}{suffix}": head for suffix, head in _HEADS.items()}
        if len(names) != 1 or names[0] not in heads:
            raise ConfigError(f"{where}: architectures {names!r}: the zoo's {self.model_type} "
                              f"has one of {sorted(heads)}")
        return heads[names[0]]

    def hub_config(self, config: Config) -> dict[str, Any]:
        if not isinstance(config, BertConfig):
            raise ConfigError(f"a {self.model_type} config.json holds a bert, not a "
                              f"{config.arch}")
        suffix = {head: suffix for suffix, head in _HEADS.items()}[config.head]
        labels = ({"id2label": {str(i): f"LABEL_{i}" for i in range(config.num_labels)}}
                  if config.head == "sequence_classification" else {})
        return {"architectures": [f"{self.prefix}{suffix}"], "model_type": self.model_type,
                **{k: getattr(config, k) for k in _FIELDS}, **labels}


class BertReader(EncoderReader):
    model_type = "bert"
    prefix = "Bert"
    defaults: ClassVar[dict[str, Any]] = {}


class RobertaReader(EncoderReader):
    model_type = "roberta"
    prefix = "Roberta"
    defaults: ClassVar[dict[str, Any]] = {"pad_token_id": 1}


READERS: tuple[HubReader, ...] = (BertReader(), RobertaReader())
