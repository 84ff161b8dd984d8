"""BERT and RoBERTa as a benchmark subject (`zoo.bench.spec`): their sizes and the FLOPs of
their matrix products (the floor of the benchmark's FLOP check): the body's, read from its
spec as the decoder-only families' (`decoder_flops`), with the vocabulary head only where the
config has the masked-LM head. Forward and training steps on batches of `length` tokens; an
encoder does not generate."""

from typing import Any

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, decoder_flops, register
from zoo.models.bert.config import NAMED_MODELS


def encoder_flops(config: Any, batch: int, mode: str) -> float:
    """`decoder_flops` less the vocabulary head's `2 * length * hidden * vocab` per sequence
    (times three in training) when the head is not the masked-LM one (the classifier and
    pooler, `hidden * (hidden + labels)` per sequence, are left out of the floor)."""
    vocab_head = 2 * config.length * config.hidden_size * config.vocab_size * batch
    extra = 0 if config.head == "masked_lm" else vocab_head * (1 if mode == "forward" else 3)
    return decoder_flops(config, batch, mode) - extra


PRESETS: tuple[PresetFields, ...] = (
    {"name": "bert-small-cpu", "batch": 8,
     "config": {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
                "num_attention_heads": 4, "seq_len": 128},
     "doc": "CPU-sized BERT: width 256, 4 layers, 4 heads, 128 tokens, masked-LM head"},
    {"name": "bert-base-uncased", "batch": 8,
     "config": {**NAMED_MODELS["bert-base-uncased"], "seq_len": 128},
     "doc": "BERT base (110M, masked-LM head tied): 128 tokens"},
)

register(BenchSpec("bert", default_batch=8, useful_flops=encoder_flops, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS[1:])))
