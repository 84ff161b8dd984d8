"""The Phi-3 family as a benchmark subject (`zoo.bench.spec`): its sizes and the FLOPs of its
matrix products (the floor of the benchmark's FLOP check). Forward and training steps on
batches of `length` tokens; prefill and decode come with generation."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, decoder_flops, register
from zoo.models.phi3.config import NAMED_MODELS

PRESETS: tuple[PresetFields, ...] = (
    {"name": "phi3-small-cpu", "batch": 8,
     "config": {"vocab_size": 32064, "hidden_size": 256, "intermediate_size": 688,
                "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                "seq_len": 128},
     "doc": "CPU-sized Phi-3: width 256, 4 layers, 8 heads (2 kv), 128 tokens"},
    {"name": "phi-3-mini-4k", "batch": 2,
     "config": {**NAMED_MODELS["phi-3-mini-4k"], "seq_len": 256},
     "doc": "Phi-3-mini-4k (3.8B, fused qkv_proj and gate_up_proj): 256 tokens"},
)

register(BenchSpec("phi3", default_batch=8, useful_flops=decoder_flops, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS[1:])))
