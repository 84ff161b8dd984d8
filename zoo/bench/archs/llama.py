"""The Llama family as a benchmark subject (`zoo.bench.spec`): its sizes and the FLOPs of its
matrix products (the floor of the benchmark's FLOP check). Forward and training steps on
batches of `length` tokens; prefill and decode come with generation."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, decoder_flops, register
from zoo.models.llama.config import NAMED_MODELS

PRESETS: tuple[PresetFields, ...] = (
    {"name": "llama-small-cpu", "batch": 8,
     "config": {"vocab_size": 32000, "hidden_size": 256, "intermediate_size": 688,
                "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                "seq_len": 128},
     "doc": "CPU-sized Llama: width 256, 4 layers, 8 heads (2 kv), 128 tokens"},
    {"name": "qwen2.5-0.5b", "batch": 4, "config": {**NAMED_MODELS["qwen2.5-0.5b"], "seq_len": 256},
     "doc": "Qwen2.5-0.5B (494M, tied head, q/k/v biases): 256 tokens"},
)

register(BenchSpec("llama", default_batch=8, useful_flops=decoder_flops, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS[1:])))
