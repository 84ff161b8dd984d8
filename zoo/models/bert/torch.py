"""BERT and RoBERTa in PyTorch, the reference: the shared body (`zoo.models.decoder.torch`) as
`BertConfig.decoder` configures it, and the config's head with transformers' names
(`Family`): the masked-LM head (dense, activation, LayerNorm, the decoder tied to the word
embedding, its own bias), the sequence classifier or none (the base model)."""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.bert.config import BertConfig
from zoo.models.decoder.torch import ACTIVATIONS, Decoder, place


class Bert(nn.Module):
    """transformers' `BertForMaskedLM`, `BertForSequenceClassification` or `BertModel` (and
    RoBERTa's), as `config.head` says; batched `(N, L)` token ids."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        f, e = config.family, config.hidden_size
        self.config = config
        self.add_module(f.body, Decoder(config.decoder))
        self.dropout = nn.Dropout(config.classifier_rate)
        if config.head == "masked_lm":
            place(self, f"{f.mlm}.{f.mlm_dense}", nn.Linear(e, e))
            place(self, f"{f.mlm}.{f.mlm_norm}", nn.LayerNorm(e, eps=config.layer_norm_eps))
            self.get_submodule(f.mlm).register_parameter(
                "bias", nn.Parameter(torch.zeros(config.vocab_size)))
        if config.head == "sequence_classification":
            if f.classifier_dense is not None:
                place(self, f.classifier_dense, nn.Linear(e, e))
            place(self, f.classifier, nn.Linear(e, config.num_labels))

    def body(self) -> Decoder:
        return self.get_submodule(self.config.family.body)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The last hidden states `(N, L, hidden_size)`."""
        self.config.check_input(input_ids.shape)
        return self.body()(input_ids, attention_mask, position_ids, None, token_type_ids)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The head's output of token ids `(N, L)`: masked-LM logits `(N, L, vocab)`, class
        logits `(N, num_labels)` or (base) the last hidden states; `attention_mask` (0:
        padding), `position_ids` and `token_type_ids` `(N, L)` as transformers'."""
        h = self.encode(input_ids, attention_mask, position_ids, token_type_ids)
        return getattr(self, f"_{self.config.head}")(h)

    def pooled(self, h: torch.Tensor) -> torch.Tensor:
        """The base model's pooler output of the last hidden states `h`."""
        return self.body().pool(h)

    def _base(self, h: torch.Tensor) -> torch.Tensor:
        return h

    def _masked_lm(self, h: torch.Tensor) -> torch.Tensor:
        c, f, part = self.config, self.config.family, self.get_submodule
        h = ACTIVATIONS[f.mlm_activation or c.hidden_act](part(f"{f.mlm}.{f.mlm_dense}")(h))
        h = part(f"{f.mlm}.{f.mlm_norm}")(h)
        table = self.body().embedding().weight
        return h @ table.T + part(f.mlm).bias

    def _sequence_classification(self, h: torch.Tensor) -> torch.Tensor:
        f, part = self.config.family, self.get_submodule
        if f.classifier_dense is None:  # BERT: the body's pooler
            x = self.body().pool(h)
        else:
            x = self.dropout(h[:, 0]) if f.dropout_first else h[:, 0]
            x = torch.tanh(part(f.classifier_dense)(x))
        return part(f.classifier)(self.dropout(x))
