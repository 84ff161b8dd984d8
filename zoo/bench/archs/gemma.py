"""The Gemma family as a benchmark subject (`zoo.bench.spec`): its sizes and the FLOPs of its
matrix products (the floor of the benchmark's FLOP check). Forward and training steps on
batches of `length` tokens; prefill and decode come with generation."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, decoder_flops, register
from zoo.models.gemma.config import NAMED_MODELS

PRESETS: tuple[PresetFields, ...] = (
    {"name": "gemma-small-cpu", "batch": 8,
     "config": {"vocab_size": 32000, "hidden_size": 256, "intermediate_size": 1024,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
                "head_dim": 64, "seq_len": 128},
     "doc": "CPU-sized Gemma: width 256, 4 layers, 4 heads (1 kv) of 64, 128 tokens"},
    {"name": "gemma-3-1b", "batch": 2, "config": {**NAMED_MODELS["gemma-3-1b"], "seq_len": 256},
     "doc": "Gemma 3 1B (1.0B, tied head, 5:1 local/global layers): 256 tokens"},
)

register(BenchSpec("gemma", default_batch=8, useful_flops=decoder_flops, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS[1:])))
