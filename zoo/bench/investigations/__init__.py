"""Investigations: studies run once to explain a measurement, apart from the measuring code.
Each has a subcommand (`python -m zoo.bench breakdown`, `xla-cpu`) and a write-up in
docs/investigations/ (the CPU training step's cost breakdown, XLA:CPU's limits)."""
