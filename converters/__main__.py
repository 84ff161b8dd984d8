"""Command line: convert and inspect checkpoints of Equinox, Linen, NNX and PyTorch.

    python -m converters convert SRC DST --to {eqx,linen,nnx,canonical,torch} [--force]
        [--arch ARCH] [--config JSON_OR_FILE] [--model-only] [--progress | --no-progress]
    python -m converters inspect SRC [--arch ARCH] [--config JSON_OR_FILE]

Exit status: 0 on success, 1 when the checkpoint cannot be read, validated or written (the
message names each offending key), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from converters.checkpoints import FORMATS, Report, convert_file, detect, disk_size
from converters.checkpoints import inspect_checkpoint as inspect_file
from converters.checkpoints.io import CheckpointError, ProgressFn
from converters.core import ConversionError
from zoo.configs import ConfigError

PROGRESS_BYTES = 64 * 2**20  # show a progress bar from this source size on (unless told)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m converters",
        description="Convert and inspect checkpoints between Equinox, Flax Linen, Flax NNX, "
                    "PyTorch and the canonical safetensors layout.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--arch", help="architecture, when the source does not carry one")
        sp.add_argument("--config", help="config as a JSON object or a JSON file, when the "
                        "source does not carry one")
        sp.add_argument("--debug", action="store_true", help="show tracebacks on errors")

    c = sub.add_parser("convert", help="convert SRC into format --to at DST")
    c.add_argument("src", help="source checkpoint: a file or an orbax directory")
    c.add_argument("dst", help="destination (written atomically; refused if it exists)")
    c.add_argument("--to", required=True, choices=FORMATS, help="target format")
    c.add_argument("--force", action="store_true", help="replace DST if it exists")
    c.add_argument("--model-only", action="store_true",
                   help="drop optimizer state and step (needed for --to torch)")
    bar = c.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show a progress bar")
    bar.add_argument("--no-progress", dest="progress", action="store_false",
                     help="never show a progress bar")
    common(c)
    i = sub.add_parser("inspect", help="describe a checkpoint and check it loads into the zoo")
    i.add_argument("src", help="checkpoint: a file or an orbax directory")
    common(i)
    return p


@contextlib.contextmanager
def _progress_bar(console: Console, enabled: bool) -> Iterator[ProgressFn | None]:
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        tasks: dict[str, Any] = {}

        def update(description: str, completed: int, total: int | None) -> None:
            if description not in tasks:
                tasks[description] = bar.add_task(description, total=total)
            bar.update(tasks[description], completed=completed, total=total)

        yield update


def _convert(args: argparse.Namespace, console: Console) -> int:
    det = detect(args.src)
    console.print(f"source: {args.src}")
    console.print(f"  detected format: [bold]{det.fmt}[/bold] ({det.reason})")
    show = args.progress if args.progress is not None else disk_size(args.src) >= PROGRESS_BYTES
    with _progress_bar(console, show) as progress:
        ck = convert_file(args.src, args.dst, args.to, force=args.force, arch=args.arch,
                          config=args.config, model_only=args.model_only, progress=progress)
    console.print(f"  architecture: {ck.config.arch} {ck.config.to_json()}", highlight=False)
    kind = (f"training checkpoint (step {ck.step}, optimizer state "
            f"{'yes' if ck.optimizer is not None else 'no'})" if ck.training else "model")
    console.print(f"  contents: {kind}, {len(ck.state)} keys, dtype {ck.dtype}")
    console.print(f"wrote {args.dst} as [bold]{args.to}[/bold]")
    return 0


def _inspect(args: argparse.Namespace, console: Console) -> int:
    r: Report = inspect_file(args.src, arch=args.arch, config=args.config)
    console.print(f"path: {r.path}")
    console.print(f"format: [bold]{r.fmt}[/bold] ({r.reason})")
    if r.config is not None:
        console.print(f"architecture: {r.config.arch}")
        console.print(f"config: {r.config.to_json()}", highlight=False)
    else:
        console.print("architecture: unknown")
    console.print(f"kind: {r.kind}" + (f", step {r.step}" if r.step is not None else ""))
    table = Table(title=f"{len(r.entries)} stored arrays")
    table.add_column("key")
    table.add_column("shape", justify="right")
    table.add_column("dtype")
    for name, shape, dtype in r.entries:
        table.add_row(name, str(tuple(shape)), dtype)
    console.print(table)
    console.print(f"stored values: {r.stored_values:,}")
    if r.parameters is not None:
        console.print(f"parameters (trainable, excluding BatchNorm statistics): {r.parameters:,}")
    if r.loads:
        console.print("loads into the zoo: [green]yes[/green] (every key, shape and dtype match "
                      "the config)")
        return 0
    if r.loads is None:
        console.print(f"loads into the zoo: unknown: {r.problem}", highlight=False)
        return 0
    console.print("loads into the zoo: [red]no[/red]")
    console.print(r.problem, highlight=False, markup=False)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(highlight=False, soft_wrap=True)
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        return _convert(args, console) if args.command == "convert" else _inspect(args, console)
    except (CheckpointError, ConversionError, ConfigError, OSError) as e:
        if args.debug:
            raise
        errors.print(f"error: {e}", markup=False)
        return 1
    except KeyboardInterrupt:
        errors.print("interrupted: nothing was written")
        return 130


if __name__ == "__main__":
    sys.exit(main())
