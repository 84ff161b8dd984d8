"""GPT-2 as a benchmark subject (`zoo.bench.spec`): its sizes and the FLOPs of its matrix
products (the floor of the benchmark's FLOP check). Forward and training steps on batches of
`length` tokens; prefill and decode come with generation.

Dropout is off unless `--config` sets a rate: the fairness check compares the first training
loss of every library, and each library draws its dropout masks from its own generator (the
published configs' 0.1 would make them differ, and the work is the same either way)."""

from typing import Any

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, ZooSubjects, decoder_flops, register
from zoo.configs import Overrides

NO_DROPOUT = {"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}


class GPT2Subjects(ZooSubjects):
    """The zoo's GPT-2 with dropout off unless the overrides set it."""

    def config(self, arch: str, overrides: Overrides, method: str) -> Any:
        return super().config(arch, {**NO_DROPOUT, **overrides}, method)


PRESETS: tuple[PresetFields, ...] = (
    {"name": "gpt2-124m", "batch": 4, "config": {"seq_len": 256},
     "doc": "transformers' gpt2 (124M): width 768, 12 layers, 12 heads, 256 tokens"},
    {"name": "gpt2-small-cpu", "batch": 8,
     "config": {"n_embd": 256, "n_layer": 4, "n_head": 4, "seq_len": 128},
     "doc": "CPU-sized GPT-2: width 256, 4 layers, 4 heads, 128 tokens"},
)

register(BenchSpec("gpt2", default_batch=8, useful_flops=decoder_flops, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS[:1]), subjects=GPT2Subjects()))
