"""The CNN as a benchmark subject (`zoo.bench.spec`)."""

from zoo.bench.spec import BenchSpec, register

register(BenchSpec("cnn", default_batch=64, presets=(
    {"name": "cpu", "batch": 64, "doc": "default CNN (MNIST 28x28, BatchNorm), batch 64"},
)))
