"""`python -m zoo.bench ...`: see zoo/bench/cli.py or `python -m zoo.bench --help`."""

from zoo.bench.cli import main

raise SystemExit(main())
