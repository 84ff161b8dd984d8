"""BERT and RoBERTa (transformers' `BertForMaskedLM` / `BertForSequenceClassification` /
`BertModel` names and shapes, and RoBERTa's through `model_type`): the shared body's
bidirectional attention and post-LayerNorm blocks, learned positions (RoBERTa's counted from
the padding), token types and an embedding LayerNorm; the masked-LM head tied to the word
embedding, the sequence classifier, or the hidden states and the tanh pooler."""

from zoo.models.bert.config import BertConfig
from zoo.registry import register

register(BertConfig, eqx=".eqx:Bert", linen=".linen:Bert", nnx=".nnx:Bert", torch=".torch:Bert")
