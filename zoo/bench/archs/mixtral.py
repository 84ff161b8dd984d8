"""The mixture-of-experts family as a benchmark subject (`zoo.bench.spec`): its sizes and the
FLOPs of its matrix products (the floor of the benchmark's FLOP check: each token's router and
its top-k experts only). Forward and training steps on batches of `length` tokens; prefill and
decode come with generation."""

from zoo.bench.spec import BenchSpec, PresetFields, decoder_flops, register

PRESETS: tuple[PresetFields, ...] = (
    {"name": "mixtral-small-cpu", "batch": 8,
     "config": {"vocab_size": 32000, "hidden_size": 256, "intermediate_size": 512,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
                "num_local_experts": 8, "num_experts_per_tok": 2, "seq_len": 128},
     "doc": "CPU-sized Mixtral: width 256, 4 layers, 8 experts of 512 (top 2), 128 tokens"},
    {"name": "qwen3-moe-small-cpu", "batch": 8,
     "config": {"model_type": "qwen3_moe", "vocab_size": 32000, "hidden_size": 256,
                "intermediate_size": 768, "moe_intermediate_size": 128, "qk_norm": True,
                "head_dim": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 1, "num_local_experts": 16, "num_experts_per_tok": 4,
                "seq_len": 128},
     "doc": "CPU-sized Qwen3-MoE: width 256, 4 layers, 16 experts of 128 (top 4), 128 tokens"},
)

register(BenchSpec("mixtral", default_batch=8, useful_flops=decoder_flops, presets=PRESETS))
