"""The Gemma family as a benchmark subject (`zoo.bench.spec`): its sizes and the FLOPs of its
matrix products (the floor of the benchmark's FLOP check). Forward and training steps on
batches of `length` tokens; prefill and decode come with generation."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, register
from zoo.models.gemma.config import NAMED_MODELS, GemmaConfig


def useful_flops(config: GemmaConfig, batch: int, mode: str) -> float:
    """Multiply-adds x 2 of the q/k/v/o projections, the two attention products (the whole
    square, as computed: a sliding window masks, it does not skip), the GeGLU MLP and the
    tied head, per token; a training step three times that."""
    e, t, d = config.hidden_size, config.length, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    block = (2 * t * e * (2 * q + 2 * kv + 3 * config.intermediate_size)
             + 2 * 2 * t * t * q)
    forward = batch * (config.num_hidden_layers * block + 2 * t * e * config.vocab_size)
    return float(forward if mode == "forward" else 3 * forward)


PRESETS: tuple[PresetFields, ...] = (
    {"name": "gemma-small-cpu", "batch": 8,
     "config": {"vocab_size": 32000, "hidden_size": 256, "intermediate_size": 1024,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
                "head_dim": 64, "seq_len": 128},
     "doc": "CPU-sized Gemma: width 256, 4 layers, 4 heads (1 kv) of 64, 128 tokens"},
    {"name": "gemma-3-1b", "batch": 2, "config": {**NAMED_MODELS["gemma-3-1b"], "seq_len": 256},
     "doc": "Gemma 3 1B (1.0B, tied head, 5:1 local/global layers): 256 tokens"},
)

register(BenchSpec("gemma", default_batch=8, useful_flops=useful_flops, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS[1:])))
