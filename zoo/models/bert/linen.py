"""BERT and RoBERTa in Flax Linen: the shared body (`zoo.models.decoder.linen`) as
`BertConfig.decoder` configures it and the config's head with transformers' names; batched
token ids `(N, L)`, the masked-LM decoder `word_embeddings.attend` (no array of its own)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.layers.linen import LayerNorm
from zoo.models.bert.config import BertConfig
from zoo.models.common import activation, dtype_of
from zoo.models.decoder.linen import Decoder, Param, at, nest


class Bert(nn.Module):
    """transformers' `BertForMaskedLM`, `BertForSequenceClassification` or `BertModel` (and
    RoBERTa's), as `config.head` says."""

    config: BertConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        c, f, dt = self.config, self.config.family, dtype_of(self.param_dtype)
        dense = lambda n: lambda: nn.Dense(n, param_dtype=dt)
        items: list[tuple[str, Any]] = [(f.body, lambda: Decoder(c.decoder, self.param_dtype))]
        if c.head == "masked_lm":
            items += [(f"{f.mlm}.{f.mlm_dense}", dense(c.hidden_size)),
                      (f"{f.mlm}.{f.mlm_norm}",
                       lambda: LayerNorm(epsilon=c.layer_norm_eps, param_dtype=dt)),
                      (f.mlm_bias, Param((c.vocab_size,), dt))]
        if c.head == "sequence_classification":
            if f.classifier_dense is not None:
                items.append((f.classifier_dense, dense(c.hidden_size)))
            items.append((f.classifier, dense(c.num_labels)))
        for name, maker in nest(items):
            setattr(self, name, maker())
        self.dropout = nn.Dropout(c.classifier_rate)

    def body(self) -> Decoder:
        return getattr(self, self.config.family.body)

    def encode(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
               position_ids: jax.Array | None = None, token_type_ids: jax.Array | None = None,
               train: bool = False) -> jax.Array:
        """The last hidden states `(N, L, hidden_size)`."""
        self.config.check_input(input_ids.shape)
        return self.body()(input_ids, attention_mask, position_ids, train, token_type_ids)

    def __call__(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                 position_ids: jax.Array | None = None, token_type_ids: jax.Array | None = None,
                 train: bool = False) -> jax.Array:
        """The head's output of token ids `(N, L)`: masked-LM logits `(N, L, vocab)`, class
        logits `(N, num_labels)` or (base) the last hidden states; `attention_mask` (0:
        padding), `position_ids`, `token_type_ids` `(N, L)` as transformers'."""
        h = self.encode(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        token_type_ids=token_type_ids, train=train)
        return getattr(self, f"_{self.config.head}")(h, train)

    def pooled(self, h: jax.Array) -> jax.Array:
        """The base model's pooler output of the last hidden states `h`."""
        return self.body().pool(h)

    def _base(self, h: jax.Array, train: bool) -> jax.Array:
        return h

    def _masked_lm(self, h: jax.Array, train: bool) -> jax.Array:
        c, f = self.config, self.config.family
        h = activation(f.mlm_activation or c.hidden_act)(at(self, f"{f.mlm}.{f.mlm_dense}")(h))
        h = at(self, f"{f.mlm}.{f.mlm_norm}")(h)
        logits = self.body().attend(h)
        return logits + at(self, f.mlm_bias)[None, None]

    def _sequence_classification(self, h: jax.Array, train: bool) -> jax.Array:
        f = self.config.family
        drop = lambda x: self.dropout(x, deterministic=not train)
        if f.classifier_dense is None:  # BERT: the body's pooler
            x = self.body().pool(h)
        else:
            x = drop(h[:, 0]) if f.dropout_first else h[:, 0]
            x = jnp.tanh(at(self, f.classifier_dense)(x))
        return at(self, f.classifier)(drop(x))
