"""The 3-D decoder as a benchmark subject (`zoo.bench.spec`): its training step is one of the
GPU matrix's conv-transpose runs, with every method."""

from zoo.bench.spec import BenchSpec, MatrixRun, register

register(BenchSpec(
    "decoder3d", default_batch=2,
    presets=(
        {"name": "cpu", "batch": 2, "doc": "default decoder (32x8^3 latent -> 4x64^3), batch 2"},
        {"name": "decoder3d-train", "batch": 2, "modes": ("train",),
         "doc": "the decoder train step: default config (32x8^3 latent -> 4x64^3), batch 2"},
    ),
    matrix=(MatrixRun("decoder", "decoder3d-train", ("--mode", "train"), methods=True),),
))
