"""BERT and RoBERTa in Equinox: the shared body (`zoo.models.decoder.eqx`) as
`BertConfig.decoder` configures it and the config's head with transformers' names; one
sequence `(L,)` per call (batched with vmap), the masked-LM decoder `h @ word_embeddings.T`
(`contract`: no array of its own)."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.dense import contract
from zoo.layers.eqx import LayerNorm, Linear
from zoo.models.bert.config import BertConfig
from zoo.models.common import activation, dtype_of
from zoo.models.decoder.eqx import Decoder, at, make_decoder, nest

Key = PRNGKeyArray | None


def _keys(key: Key, n: int) -> list[Key]:
    return [None] * n if key is None else list(jax.random.split(key, n))


class Bert(eqx.Module):
    """transformers' `BertForMaskedLM`, `BertForSequenceClassification` or `BertModel` (and
    RoBERTa's), as `config.head` says: the fields of both families' top-level names, those
    the config does not have None."""

    bert: Decoder | None
    roberta: Decoder | None
    cls: eqx.Module | None  # BERT's masked-LM head, `cls.predictions`
    lm_head: eqx.Module | None  # RoBERTa's
    classifier: eqx.Module | None
    dropout: eqx.nn.Dropout
    config: BertConfig = eqx.field(static=True)

    def __init__(self, config: BertConfig, *, key: PRNGKeyArray, dtype: Any = None) -> None:
        dt, f, e, v = dtype_of(dtype), config.family, config.hidden_size, config.vocab_size
        k1, k2, k3, k4 = jax.random.split(key, 4)
        items: list[tuple[str, Any]] = [(f.body, make_decoder(config.decoder, key=k1,
                                                              dtype=dt))]
        if config.head == "masked_lm":
            items += [(f"{f.mlm}.{f.mlm_dense}", Linear(e, e, key=k2, dtype=dt)),
                      (f"{f.mlm}.{f.mlm_norm}", LayerNorm(e, eps=config.layer_norm_eps,
                                                          dtype=dt)),
                      (f.mlm_bias, jnp.zeros((v,), dt))]
        if config.head == "sequence_classification":
            if f.classifier_dense is not None:
                items.append((f.classifier_dense, Linear(e, e, key=k3, dtype=dt)))
            items.append((f.classifier, Linear(e, config.num_labels, key=k4, dtype=dt)))
        for name in ("bert", "roberta", "cls", "lm_head", "classifier"):
            setattr(self, name, None)
        for name, module in nest(items):
            setattr(self, name, module)
        self.dropout = eqx.nn.Dropout(config.classifier_rate)
        self.config = config

    def body(self) -> Decoder:
        return getattr(self, self.config.family.body)

    def encode(self, input_ids: Array, *, attention_mask: Array | None = None,
               position_ids: Array | None = None, token_type_ids: Array | None = None,
               key: Key = None) -> Array:
        """The last hidden states `(L, hidden_size)` of one sequence."""
        self.config.check_input(input_ids.shape, batched=False)
        return self.body()(input_ids, attention_mask, position_ids, None, key,
                           token_type_ids)[0]

    def __call__(self, input_ids: Array, *, attention_mask: Array | None = None,
                 position_ids: Array | None = None, token_type_ids: Array | None = None,
                 key: Key = None) -> Array:
        """The head's output of one sequence of token ids `(L,)`: masked-LM logits
        `(L, vocab)`, class logits `(num_labels,)` or (base) the last hidden states;
        `attention_mask` (0: padding), `position_ids`, `token_type_ids` `(L,)` as
        transformers'."""
        k_body, k_head = _keys(key, 2)
        h = self.encode(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        token_type_ids=token_type_ids, key=k_body)
        return getattr(self, f"_{self.config.head}")(h, k_head)

    def pooled(self, h: Array) -> Array:
        """The base model's pooler output of one sequence's last hidden states `h`."""
        return self.body().pool(h)

    def _base(self, h: Array, key: Key) -> Array:
        return h

    def _masked_lm(self, h: Array, key: Key) -> Array:
        c, f = self.config, self.config.family
        dense, norm = at(self, f"{f.mlm}.{f.mlm_dense}"), at(self, f"{f.mlm}.{f.mlm_norm}")
        h = jax.vmap(lambda t: norm(activation(f.mlm_activation or c.hidden_act)(dense(t))))(h)
        table = self.body().embedding().weight
        bias = at(self, f.mlm_bias)
        return contract(h, table) + bias[None]

    def _sequence_classification(self, h: Array, key: Key) -> Array:
        f = self.config.family
        k1, k2 = _keys(key, 2)
        if f.classifier_dense is None:  # BERT: the body's pooler
            x = self.body().pool(h)
        else:
            x = self.dropout(h[0], key=k1) if f.dropout_first else h[0]
            x = jnp.tanh(at(self, f.classifier_dense)(x))
        return at(self, f.classifier)(self.dropout(x, key=k2))
