"""The Llama family as a benchmark subject (`zoo.bench.spec`): its sizes and the FLOPs of its
matrix products (the floor of the benchmark's FLOP check). Forward and training steps on
batches of `length` tokens; prefill and decode come with generation."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, register
from zoo.models.llama.config import NAMED_MODELS, LlamaConfig


def useful_flops(config: LlamaConfig, batch: int, mode: str) -> float:
    """Multiply-adds x 2 of the q/k/v/o projections, the two attention products (the whole
    square, as computed, masked or not), the SwiGLU MLP and the head, per token; a training
    step three times that."""
    e, t, d = config.hidden_size, config.length, config.dim
    q, kv = config.num_attention_heads * d, config.kv_heads * d
    block = (2 * t * e * (2 * q + 2 * kv + 3 * config.intermediate_size)
             + 2 * 2 * t * t * q)
    forward = batch * (config.num_hidden_layers * block + 2 * t * e * config.vocab_size)
    return float(forward if mode == "forward" else 3 * forward)


PRESETS: tuple[PresetFields, ...] = (
    {"name": "llama-small-cpu", "batch": 8,
     "config": {"vocab_size": 32000, "hidden_size": 256, "intermediate_size": 688,
                "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                "seq_len": 128},
     "doc": "CPU-sized Llama: width 256, 4 layers, 8 heads (2 kv), 128 tokens"},
    {"name": "qwen2.5-0.5b", "batch": 4, "config": {**NAMED_MODELS["qwen2.5-0.5b"], "seq_len": 256},
     "doc": "Qwen2.5-0.5B (494M, tied head, q/k/v biases): 256 tokens"},
)

register(BenchSpec("llama", default_batch=8, useful_flops=useful_flops, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS[1:])))
