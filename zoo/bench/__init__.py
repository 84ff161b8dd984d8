"""Fair benchmarks of the zoo's models: `python -m zoo.bench` (see docs/benchmarks.md).

    python -m zoo.bench cnn --impl all --mode both --call all [--precision highest]
    python -m zoo.bench dispatch
    python -m zoo.bench matrix --out bench/results [--quick]
    python -m zoo.bench report

Before anything is timed, the implementations being compared are built from one canonical
state and must agree on parameter counts, outputs (strictly at full float32, then at the timed
precision: `zoo.runtime.precision`) and FLOP counts (`zoo.bench.flops`), see `zoo.bench.fairness`;
otherwise `FairnessError` is raised and the command exits with status 3. The fastest call style
of each library is public as `zoo.runtime.fast`.
"""

from zoo.bench.cli import main
from zoo.bench.fairness import FairnessError, check_fairness
from zoo.bench.presets import PRESETS, Preset, find_preset
from zoo.bench.runner import BenchConfig, run
from zoo.bench.subjects import Subject, Task, make_task

__all__ = ["PRESETS", "BenchConfig", "FairnessError", "Preset", "Subject", "Task",
           "check_fairness", "find_preset", "main", "make_task", "run"]
