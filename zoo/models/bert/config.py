"""BERT's and RoBERTa's configuration: transformers' `BertConfig` / `RobertaConfig` field names
and defaults (`bert-base-uncased`), `model_type` choosing the family's names (`FAMILIES`) and
`head` the model: `BertForMaskedLM` ("masked_lm"), `BertForSequenceClassification`
("sequence_classification") or `BertModel` ("base": the last hidden state; `pooled` gives the
tanh pooler's output)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from canonical.ties import Tie
from zoo.configs import ConfigError, positive
from zoo.models.decoder import AttentionSpec, DecoderSpec, MLPSpec, Names
from zoo.models.language import LanguageModelConfig

_BLOCK = (("attention.self", "attention"), ("attention.output", "attention_output"),
          ("intermediate", "mlp"), ("output", "mlp_output"))


@dataclass(frozen=True)
class Family:
    """One `model_type`'s module names: the body's prefix, the masked-LM head's (`mlm`: its
    dense, norm and bias below it) and the classification head's (`classifier_dense` then
    tanh then `classifier`, on the first token; None: the body's pooler is the dense, BERT's;
    RoBERTa's has its own, after a dropout: `dropout_first`); positions counted from the
    padding (`padded_positions`)."""

    body: str
    mlm: str
    mlm_dense: str
    mlm_norm: str
    classifier_dense: str | None
    classifier: str
    dropout_first: bool
    padded_positions: bool
    mlm_activation: str | None  # None: hidden_act (BERT's); RoBERTa's head is always GELU

    @property
    def mlm_bias(self) -> str:
        return f"{self.mlm}.bias"


FAMILIES: dict[str, Family] = {
    "bert": Family("bert", "cls.predictions", "transform.dense", "transform.LayerNorm", None,
                   "classifier", False, False, None),
    "roberta": Family("roberta", "lm_head", "dense", "layer_norm", "classifier.dense",
                      "classifier.out_proj", True, True, "gelu"),
}
# The published config.json files (tests/fixtures/hf_configs/ holds them; each named model is
# pinned there to transformers' keys, shapes and parameter count).
_ROBERTA = {"model_type": "roberta", "vocab_size": 50265, "type_vocab_size": 1,
            "pad_token_id": 1, "layer_norm_eps": 1e-5, "max_position_embeddings": 514}
NAMED_MODELS: dict[str, dict[str, Any]] = {
    "bert-base-uncased": {},
    "bert-large-uncased": {"hidden_size": 1024, "num_hidden_layers": 24,
                           "num_attention_heads": 16, "intermediate_size": 4096},
    "all-minilm-l6-v2": {"hidden_size": 384, "num_hidden_layers": 6, "intermediate_size": 1536,
                         "head": "base", "pooling": "mean"},
    "roberta-base": _ROBERTA,
    "roberta-large": {**_ROBERTA, "hidden_size": 1024, "num_hidden_layers": 24,
                      "num_attention_heads": 16, "intermediate_size": 4096},
}
# The releases on the Hub (zoo.create("roberta-base.facebook", impl, pretrained=True)).
HUB_REPOS: dict[str, dict[str, Any]] = {
    name: {tag: {"hub": repo, "license": licence}} for name, (tag, repo, licence) in {
        "bert-base-uncased": ("google", "google-bert/bert-base-uncased", "apache-2.0"),
        "bert-large-uncased": ("google", "google-bert/bert-large-uncased", "apache-2.0"),
        "all-minilm-l6-v2": ("sbert", "sentence-transformers/all-MiniLM-L6-v2", "apache-2.0"),
        "roberta-base": ("facebook", "FacebookAI/roberta-base", "mit"),
        "roberta-large": ("facebook", "FacebookAI/roberta-large", "mit"),
    }.items()}


@dataclass(frozen=True)
class BertConfig(LanguageModelConfig):
    """transformers' BERT (and, `model_type` "roberta", RoBERTa): word, learned position and
    token type embeddings summed and LayerNormed, post-LayerNorm blocks (`attention.self`
    `query`/`key`/`value` attending both ways, `attention.output` `dense` + `LayerNorm`,
    `intermediate.dense` with `hidden_act`, `output` `dense` + `LayerNorm`), then `head`.
    Dropout after the embeddings and each branch (`hidden_dropout_prob`) and on the attention
    weights (`attention_probs_dropout_prob`), in training only. RoBERTa counts positions from
    `pad_token_id + 1`. `pooling` ("mean" or "cls") is how `zoo.embed` makes a sentence
    embedding of a sentence-embedding checkpoint (None: the caller says)."""

    arch: ClassVar[str] = "bert"
    GENERATES: ClassVar[bool] = False
    REFERENCES: ClassVar[dict[str, str]] = {
        "transformers' BERT and RoBERTa (masked LM, sequence classification, base)":
            "tests/test_encoders.py",
        "the published config.json files, parameter counts": "tests/test_encoders.py",
    }
    TINY: ClassVar[dict[str, Any]] = {"vocab_size": 96, "hidden_size": 16,
                                      "num_hidden_layers": 2, "num_attention_heads": 2,
                                      "intermediate_size": 24, "max_position_embeddings": 16,
                                      "hidden_dropout_prob": 0.0,
                                      "attention_probs_dropout_prob": 0.0, "seq_len": 8}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = NAMED_MODELS
    HEADLESS: ClassVar[dict[str, Any]] = {"head": "base"}  # transformers' BertModel
    HUB_REPOS: ClassVar[dict[str, dict[str, Any]]] = HUB_REPOS
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: Literal["gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"] = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    tie_word_embeddings: bool = True
    model_type: Literal["bert", "roberta"] = "bert"
    head: Literal["masked_lm", "sequence_classification", "base"] = "masked_lm"
    num_labels: int = 2
    classifier_dropout: float | None = None  # None: hidden_dropout_prob
    pooling: Literal["mean", "cls"] | None = None
    seq_len: int | None = None

    def validate(self) -> None:
        positive("bert sizes", (self.vocab_size, self.hidden_size, self.num_hidden_layers,
                                self.num_attention_heads, self.intermediate_size,
                                self.max_position_embeddings, self.type_vocab_size,
                                self.num_labels))
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"bert.hidden_size {self.hidden_size} must be a multiple of "
                              f"num_attention_heads {self.num_attention_heads}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"bert.{name} must be in [0, 1), found {getattr(self, name)}")
        if self.head == "masked_lm" and not self.tie_word_embeddings:
            raise ConfigError("bert.tie_word_embeddings false: an untied masked-LM decoder (its "
                              "own weight and bias, transformers' cls.predictions.bias unused) "
                              "is not supported")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"bert.pad_token_id {self.pad_token_id} is not a token id "
                              f"(vocab_size {self.vocab_size})")
        self.check_lengths()

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    @property
    def LOSS(self) -> str:
        """The head's task: masked tokens, the class, or (base) the hidden states."""
        return {"masked_lm": "masked_token", "sequence_classification": "cross_entropy",
                "base": "mse"}[self.head]

    @property
    def EMBEDDING(self) -> str:
        return f"{self.family.body}.embeddings.word_embeddings.weight"

    @property
    def max_length(self) -> int:
        """The positions a sequence may take (RoBERTa's first `pad_token_id + 1` are not)."""
        offset = self.pad_token_id + 1 if self.family.padded_positions else 0
        return self.max_position_embeddings - offset

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def dropout(self) -> float:
        """The largest dropout rate (a training step draws a dropout key when positive)."""
        return max(self.hidden_dropout_prob, self.attention_probs_dropout_prob,
                   self.classifier_rate)

    @property
    def classifier_rate(self) -> float:
        """The classification head's dropout (transformers': `classifier_dropout`, else
        `hidden_dropout_prob`)."""
        return (self.hidden_dropout_prob if self.classifier_dropout is None
                else self.classifier_dropout)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return {"masked_lm": (self.length, self.vocab_size),
                "sequence_classification": (self.num_labels,),
                "base": (self.length, self.hidden_size)}[self.head]

    @property
    def ties(self) -> tuple[Tie, ...]:
        """The masked-LM decoder tied to the word embedding and its bias to the head's
        (transformers lists `decoder.weight` and `decoder.bias` beside them)."""
        if self.head != "masked_lm":
            return ()
        f = self.family
        return (Tie(f"{f.mlm}.decoder.weight", self.EMBEDDING),
                Tie(f"{f.mlm}.decoder.bias", f.mlm_bias))

    @property
    def decoder(self) -> DecoderSpec:
        """The shared body's options: bidirectional BERT attention, post-LayerNorm blocks,
        token types and an embedding LayerNorm, no final norm; the pooler of the base model
        and of BERT's classifier."""
        f = self.family
        pools = self.head == "base" or (self.head == "sequence_classification"
                                        and f.classifier_dense is None)
        names = Names(body=f.body, embedding="embeddings.word_embeddings",
                      layers="encoder.layer", norm=None, block=_BLOCK,
                      positions="embeddings.position_embeddings",
                      token_types="embeddings.token_type_embeddings",
                      embedding_norm="embeddings.LayerNorm",
                      pooler="pooler.dense" if pools else None)
        return DecoderSpec(
            names, self.vocab_size, self.hidden_size, self.num_hidden_layers, "layer_norm",
            self.layer_norm_eps,
            AttentionSpec("query_key_value", self.num_attention_heads,
                          self.num_attention_heads, self.head_dim, qkv_bias=True,
                          out_bias=True, dropout=self.attention_probs_dropout_prob,
                          causal=False),
            MLPSpec("dense", self.intermediate_size, self.hidden_act, bias=True),
            max_positions=self.max_position_embeddings,
            embedding_dropout=self.hidden_dropout_prob,
            residual_dropout=self.hidden_dropout_prob,
            tie_word_embeddings=self.tie_word_embeddings, type_vocab_size=self.type_vocab_size,
            padding_idx=self.pad_token_id if f.padded_positions else None)
