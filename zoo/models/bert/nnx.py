"""BERT and RoBERTa in Flax NNX: the shared body (`zoo.models.decoder.nnx`) as
`BertConfig.decoder` configures it and the config's head with transformers' names; batched
token ids `(N, L)`, the masked-LM decoder `word_embeddings.attend` (no array of its own)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.nnx import LayerNorm
from zoo.models.bert.config import BertConfig
from zoo.models.common import activation, dtype_of
from zoo.models.decoder.nnx import Decoder, Rngs, at, place


class Bert(nnx.Module):
    """transformers' `BertForMaskedLM`, `BertForSequenceClassification` or `BertModel` (and
    RoBERTa's), as `config.head` says."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs, param_dtype: Any = None) -> None:
        c, f, dt = config, config.family, dtype_of(param_dtype)
        e, v = c.hidden_size, c.vocab_size
        self.config = config
        setattr(self, f.body, Decoder(c.decoder, rngs=rngs, param_dtype=dt))
        linear = lambda i, o, **kw: nnx.Linear(i, o, param_dtype=dt, rngs=rngs, **kw)
        if c.head == "masked_lm":
            place(self, f"{f.mlm}.{f.mlm_dense}", linear(e, e))
            place(self, f"{f.mlm}.{f.mlm_norm}", LayerNorm(e, epsilon=c.layer_norm_eps,
                                                           param_dtype=dt, rngs=rngs))
            place(self, f.mlm_bias, nnx.Param(jnp.zeros((v,), dt)))
        if c.head == "sequence_classification":
            if f.classifier_dense is not None:
                place(self, f.classifier_dense, linear(e, e))
            place(self, f.classifier, linear(e, c.num_labels))
        self.dropout = nnx.Dropout(c.classifier_rate)

    def body(self) -> Decoder:
        return getattr(self, self.config.family.body)

    def encode(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
               position_ids: jax.Array | None = None, token_type_ids: jax.Array | None = None,
               rngs: Rngs = None) -> jax.Array:
        """The last hidden states `(N, L, hidden_size)`."""
        self.config.check_input(input_ids.shape)
        return self.body()(input_ids, attention_mask, position_ids, rngs, token_type_ids)

    def __call__(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                 position_ids: jax.Array | None = None, token_type_ids: jax.Array | None = None,
                 rngs: Rngs = None) -> jax.Array:
        """The head's output of token ids `(N, L)`: masked-LM logits `(N, L, vocab)`, class
        logits `(N, num_labels)` or (base) the last hidden states; `attention_mask` (0:
        padding), `position_ids`, `token_type_ids` `(N, L)` as transformers'."""
        h = self.encode(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        token_type_ids=token_type_ids, rngs=rngs)
        return getattr(self, f"_{self.config.head}")(h, rngs)

    def pooled(self, h: jax.Array) -> jax.Array:
        """The base model's pooler output of the last hidden states `h`."""
        return self.body().pool(h)

    def _base(self, h: jax.Array, rngs: Rngs) -> jax.Array:
        return h

    def _masked_lm(self, h: jax.Array, rngs: Rngs) -> jax.Array:
        c, f = self.config, self.config.family
        h = activation(f.mlm_activation or c.hidden_act)(at(self, f"{f.mlm}.{f.mlm_dense}")(h))
        h = at(self, f"{f.mlm}.{f.mlm_norm}")(h)
        logits = self.body().attend(h)
        return logits + at(self, f.mlm_bias)[...][None, None]

    def _sequence_classification(self, h: jax.Array, rngs: Rngs) -> jax.Array:
        f = self.config.family
        drop = lambda x: self.dropout(x, rngs=rngs)
        if f.classifier_dense is None:  # BERT: the body's pooler
            x = self.body().pool(h)
        else:
            x = drop(h[:, 0]) if f.dropout_first else h[:, 0]
            x = jnp.tanh(at(self, f.classifier_dense)(x))
        return at(self, f.classifier)(drop(x))
