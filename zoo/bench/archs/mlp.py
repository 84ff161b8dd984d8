"""The MLP as a benchmark subject (`zoo.bench.spec`)."""

from zoo.bench.spec import BenchSpec, register

register(BenchSpec("mlp", default_batch=128, presets=(
    {"name": "cpu", "batch": 128, "doc": "default MLP (784-512-512-10), batch 128"},
)))
