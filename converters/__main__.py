"""Command line: convert and inspect checkpoints of Equinox, Linen, NNX and PyTorch.

    python -m converters convert SRC DST --to {eqx,linen,nnx,canonical,torch,npz,msgpack,hub}
        [--force] [--arch ARCH] [--config JSON_OR_FILE | --like MODULE:ATTR] [--model-only]
        [--cast/--dtype DTYPE]
        [--map SRC=DST ...] [--strip-prefix P] [--add-prefix P] [--show-mapping] [--no-verify]
        [--weights {main,ema}] [--progress | --no-progress] [--num-classes N]
        [--image-size H,W] [--in-channels C] [--seed S] [--shard-size SIZE]
    python -m converters inspect SRC [--arch ARCH] [--config JSON_OR_FILE] [--map SRC=DST ...]

SRC is a file or folder, or a source as timm names them: ``hf-hub:ORG/REPO[@REVISION]`` (fetched
through huggingface_hub's cache, HF_HUB_CACHE; HF_HUB_OFFLINE reads only the cache) or
``local-dir:PATH``; a folder's config.json decides its reader (timm, transformers' ViT).

--num-classes / --image-size / --in-channels adapt the weights to a model of that many
classes, image size or input channels, as timm does for pretrained weights (a new classifier
drawn from --seed, a resampled ViT position embedding, an adapted first convolution; each
change is printed): the options set the config fields of those names.

A checkpoint the zoo did not write (any key names) is matched layer by layer to the
architecture (`converters.matching`): the mapping table is printed on a structural match or
with --show-mapping, and the converted model is checked against the source's library on a
random input before anything is written (unless --no-verify).

Exit status: 0 on success, 1 when the checkpoint cannot be read, validated or written (the
message names each offending key; `inspect` when it reports that the checkpoint does not load),
2 on a usage error (bad arguments, --arch, --config, a SRC that does not exist, DST that is
the source or named for another format: refused before the source is read). Every failure is
one ``error: ...`` line (the usage only with --help); tracebacks only with --debug.
``--layout NAME --to torch`` writes the state_dict in a foreign layout's names
(`converters.adapters`: torchvision's, HF's). A DST with an extension unusual for its format
gets one ``warning: ...`` line, and so does a Flax checkpoint the zoo did not write going into
a config that pads as PyTorch (the weights do not carry the padding: the line names the config
field and the --config to pass).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from converters import adapters
from converters.checkpoints import (
    DestinationWarning,
    Report,
    convert_file,
    detect,
    disk_size,
    format_names,
)
from converters.checkpoints import inspect_checkpoint as inspect_file
from converters.checkpoints.checkpoint import Detection
from converters.checkpoints.configs import parse_config
from converters.checkpoints.detect import detecting_once
from converters.checkpoints.format import for_detection
from converters.checkpoints.io import CheckpointError, ProgressFn, UsageError
from converters.checkpoints.sources import local
from converters.core import ConversionError, KeyMismatchError
from converters.matching.commands import (
    convert_foreign_cli,
    convert_like_cli,
    describe,
    describe_layout,
    mismatch_hint,
    propose,
)
from converters.matching.match import MatchError
from zoo.arguments import ArgumentParser
from zoo.configs import Config, ConfigError, PaddingWarning, config_from_dict
from zoo.progress import progress as progress_display
from zoo.weights.sources import Source

PROGRESS_BYTES = 64 * 2**20  # show a progress bar from this source size on (unless told)


def _parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m converters",
        description="Convert and inspect checkpoints between Equinox, Flax Linen, Flax NNX, "
                    "PyTorch and the canonical safetensors layout.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--arch", help="architecture or model name (resnet50), when the source "
                        "does not carry one")
        sp.add_argument("--config", help="config as a JSON object or a JSON file, when the "
                        "source does not carry one")
        sp.add_argument("--map", action="append", default=[], metavar="SRC=DST",
                        help="pair layers explicitly: a regular expression on the source "
                        "layer key and the target layer name (\\1 refers to a group)")
        sp.add_argument("--strip-prefix", default="", metavar="P",
                        help="remove P from the start of every source layer key")
        sp.add_argument("--add-prefix", default="", metavar="P",
                        help="put P before every source layer key")
        sp.add_argument("--debug", action="store_true", help="show tracebacks on errors")

    c = sub.add_parser("convert", help="convert SRC into format --to at DST")
    c.add_argument("src", help="source checkpoint: a file or a folder, or hf-hub:ORG/REPO[@REV] "
                   "or local-dir:PATH")
    c.add_argument("dst", help="destination (written atomically; refused if it exists)")
    c.add_argument("--to", required=True, choices=format_names(), metavar="FORMAT",
                   help="target format: " + ", ".join(format_names()))
    c.add_argument("--force", action="store_true", help="replace DST if it exists")
    c.add_argument("--cast", "--dtype", dest="cast", metavar="DTYPE",
                   choices=("float32", "float16", "bfloat16", "float64"),
                   help="convert every floating array to DTYPE (needed e.g. for float64 into a "
                        "JAX format without x64); nothing is ever cast without it: a bfloat16 "
                        "checkpoint stays bfloat16")
    c.add_argument("--like", metavar="MODULE:ATTR",
                   help="target your own model (any of the four libraries, or a function of "
                        "no arguments returning one) instead of a zoo --arch")
    c.add_argument("--input-shape", metavar="C,H,W",
                   help="one input sample, channels first (to trace a Linen --like model)")
    c.add_argument("--flatten-shape", metavar="C,H,W",
                   help="the conv map flattened into the first linear layer (--like models)")
    c.add_argument("--show-mapping", action="store_true",
                   help="print the layer mapping table (always printed on a structural match)")
    c.add_argument("--no-verify", dest="verify", action="store_false",
                   help="skip the forward check of a matched conversion")
    c.add_argument("--model-only", action="store_true",
                   help="drop optimizer state and step (needed for --to torch)")
    c.add_argument("--num-classes", type=int, metavar="N",
                   help="adapt to N classes: a new classifier (from --seed)")
    c.add_argument("--image-size", type=_pair, metavar="H,W",
                   help="adapt to images of H x W: the ViT's position embedding resampled")
    c.add_argument("--in-channels", type=int, metavar="C",
                   help="adapt to C input channels: the first convolution adapted as timm's")
    c.add_argument("--seed", type=int, default=0,
                   help="seed of a re-initialised classifier (default 0)")
    c.add_argument("--shard-size", metavar="SIZE",
                   help="write sharded safetensors (--to torch or canonical): a folder of "
                        "shards of at most SIZE (e.g. 5GB, 500MB) and an HF-style index")
    c.add_argument("--layout", metavar="NAME",
                   help="write the state_dict in a foreign layout's names (--to torch): "
                        + ", ".join(sorted(adapters.adapters())) + " (read back, the same "
                        "layout is recognised by its keys)")
    c.add_argument("--weights", choices=("main", "ema"),
                   help="a training checkpoint holding live and EMA weights: which to take "
                        "(default: the live ones, and the output says so)")
    bar = c.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show a progress bar")
    bar.add_argument("--no-progress", dest="progress", action="store_false",
                     help="never show a progress bar")
    common(c)
    i = sub.add_parser("inspect", help="describe a checkpoint and check it loads into the zoo")
    i.add_argument("src", help="checkpoint: a file or a folder, or hf-hub:ORG/REPO[@REV] or "
                   "local-dir:PATH")
    common(i)
    return p


ADAPT_OPTIONS: tuple[str, ...] = ("num_classes", "image_size", "in_channels")


def _pair(text: str) -> tuple[int, int]:
    parts = text.replace("x", ",").split(",")
    if len(parts) == 1:
        parts *= 2
    try:
        h, w = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected H,W (or one size), got {text!r}") from None
    return h, w


def _adapt_target(args: argparse.Namespace, det: Detection) -> Config | None:
    """The config to adapt the weights to: --arch / --config (or the file's own config) with
    the adaptation options on top; None when no option is given."""
    over = {k: getattr(args, k) for k in ADAPT_OPTIONS if getattr(args, k) is not None}
    if not over:
        return None
    base = parse_config(args.arch, args.config)
    if base is None and det.meta is not None and det.meta.get("config") is not None:
        base = config_from_dict(det.meta["config"])
    if base is None:
        raise UsageError("--num-classes / --image-size / --in-channels adapt the weights to a "
                         "model: pass --arch (the file carries no config)")
    return type(base)(**{**dataclasses.asdict(base), **over})


def _show_progress(args: argparse.Namespace) -> bool:
    """--progress / --no-progress, else a bar for sources of PROGRESS_BYTES and more."""
    return args.progress if args.progress is not None else disk_size(args.src) >= PROGRESS_BYTES


@contextlib.contextmanager
def _progress_bar(console: Console, enabled: bool) -> Iterator[ProgressFn | None]:
    if not enabled:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn())
    with progress_display(console, *columns, transient=False, in_bytes=True) as bar:
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
    if det.note:
        console.print(f"  note: {det.note}", markup=False)
    try:
        return _convert_detected(args, det, console)
    except ConversionError as e:
        line = mismatch_hint(e, args, det)
        if not line:
            raise
        first, _, details = str(e).partition("\n")
        raise ConversionError("\n".join(filter(None, (first, line, details)))) from e


def _convert_detected(args: argparse.Namespace, det: Detection, console: Console) -> int:
    if args.like:
        return convert_like_cli(args, console)
    target = _adapt_target(args, det)
    if target is not None:
        return _convert_adapted(args, target, console)
    rules = bool(args.map or args.strip_prefix or args.add_prefix)
    if det.meta is None and (rules or args.show_mapping):
        return convert_foreign_cli(args, console)
    try:
        with _progress_bar(console, _show_progress(args)) as progress:
            ck = convert_file(args.src, args.dst, args.to, force=args.force, arch=args.arch,
                              config=args.config, model_only=args.model_only,
                              progress=progress, cast=args.cast,
                              shard_size=args.shard_size, weights=args.weights,
                              layout=args.layout)
    except KeyMismatchError as e:
        config = parse_config(args.arch, args.config)
        if det.meta is not None or not for_detection(det).names_keys or config is None:
            raise  # ours, or a file storing no names to match, or no architecture given
        try:  # a checkpoint written by other code: match its layers by structure
            return convert_foreign_cli(args, console)
        except MatchError as m:
            named = {r.source for r in m.rows} & {r.target for r in m.rows if r.target}
            if not named:  # the key names carry nothing: only the matching tells what to do
                raise ConversionError(f"{args.src}: state does not fit {config.arch} by name, "
                                      f"and {m}") from m
            raise ConversionError(f"{e}\nmatching the layers by structure failed too: {m}"
                                  ) from m
    describe(console, ck)
    console.print(f"  dtype: {ck.dtype}, " + ("as stored (--dtype casts)" if args.cast is None
                                             else f"cast by --dtype {args.cast}"))
    if args.show_mapping:
        console.print("  mapping: none needed (every key is the architecture's canonical name)")
    console.print(f"wrote {args.dst} as [bold]{args.to}[/bold]{written_layout(args)}")
    return 0


def written_layout(args: argparse.Namespace) -> str:
    """", in the layout NAME (description)" when --layout was given."""
    if not args.layout:
        return ""
    return f" in the layout {args.layout} ({adapters.get(args.layout).description})"


def _convert_adapted(args: argparse.Namespace, target: Config, console: Console) -> int:
    with _progress_bar(console, _show_progress(args)) as progress:
        ck = convert_file(args.src, args.dst, args.to, force=args.force, config=target,
                          progress=progress, cast=args.cast, adapt=True, seed=args.seed,
                          shard_size=args.shard_size, weights=args.weights,
                          layout=args.layout)
    describe_layout(console, ck)
    for note in ck.adapted:
        console.print(f"  adapted: {note}", markup=False)
    if not ck.adapted:
        console.print("  adapted: nothing (the weights already fit)")
    console.print(f"wrote {args.dst} as [bold]{args.to}[/bold]{written_layout(args)} "
                  f"({target.arch} {target.to_json()})", highlight=False)
    return 0


def _inspect(args: argparse.Namespace, console: Console) -> int:
    r: Report = inspect_file(args.src, arch=args.arch, config=args.config)
    console.print(f"path: {r.path}")
    console.print(f"format: [bold]{r.fmt}[/bold] ({r.reason})")
    if r.note:
        console.print(f"note: {r.note}", markup=False)
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
    foreign = r.names_differ and detect(args.src).meta is None
    console.print("loads into the zoo: [red]no[/red]" + (" (not by its key names)" if foreign
                                                         else ""))
    if foreign:  # a checkpoint written by other code: propose a mapping of its layers
        return propose(args, r, console)
    raise CheckpointError(r.problem or f"{r.path} does not load")


ONE_LINE_WARNINGS = (DestinationWarning, PaddingWarning)


@contextlib.contextmanager
def warning_lines(errors: Console) -> Iterator[None]:
    """Print each `DestinationWarning` and `PaddingWarning` as one ``warning: ...`` line on
    `errors`."""
    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
        if issubclass(category, ONE_LINE_WARNINGS):
            errors.print(f"warning: {message}", markup=False)
        else:
            shown(message, category, *args, **kw)

    with warnings.catch_warnings():
        for category in ONE_LINE_WARNINGS:
            warnings.simplefilter("always", category)
        warnings.showwarning = show
        yield


def _silence() -> None:
    logging.disable(logging.CRITICAL)
    threading.excepthook = lambda args: None
    sys.unraisablehook = lambda unraisable: None


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Silence what orbax, absl and asyncio print (logs, thread and unraisable exceptions) from
    background threads on a failure; restored afterwards."""
    saved = logging.root.manager.disable, threading.excepthook, sys.unraisablehook
    _silence()
    try:
        yield
    finally:
        logging.disable(saved[0])
        threading.excepthook, sys.unraisablehook = saved[1], saved[2]


def _fetch_source(args: argparse.Namespace, console: Console) -> None:
    """A source SRC (hf-hub:..., local-dir:...) replaced by the local folder holding it."""
    if args.src.startswith(Source.PREFIXES):
        folder = local(args.src)
        console.print(f"fetched {args.src}: {folder}", markup=False)
        args.src = str(folder)


DETAIL_LINES = 12  # the lines an error prints after its first; --debug shows them all


def _brief(error: Exception) -> str:
    """`error`'s text cut to its first line and `DETAIL_LINES` more."""
    lines = str(error).splitlines()
    if len(lines) <= 1 + DETAIL_LINES:
        return str(error)
    more = len(lines) - 1 - DETAIL_LINES
    return "\n".join([*lines[:1 + DETAIL_LINES],
                      f"  ... {more} more lines (--debug shows them all)"])


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(highlight=False, soft_wrap=True)
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    quiet = contextlib.nullcontext() if args.debug else quiet_libraries()
    try:
        with quiet, warning_lines(errors), detecting_once():
            parse_config(args.arch, args.config)  # an unknown --arch, a bad --config
            _fetch_source(args, console)
            if not os.path.exists(args.src):
                raise UsageError(f"{args.src}: no such file or directory")
            return (_convert if args.command == "convert" else _inspect)(args, console)
    except (UsageError, ConfigError) as e:
        if args.debug:
            raise
        errors.print(f"error: {e}", markup=False)
        return 2
    except (CheckpointError, ConversionError) as e:
        if args.debug:
            raise
        errors.print(f"error: {_brief(e)}", markup=False)
        return 1
    except OSError as e:
        if args.debug:
            raise
        where = e.filename if e.filename is not None else args.src
        errors.print(f"error: {where}: {e.strerror or e}", markup=False)
        return 1
    except KeyboardInterrupt:
        errors.print("interrupted: nothing was written")
        return 130
    except Exception as e:  # a failure no check above foresaw: still one line, no traceback
        if args.debug:
            raise
        text = str(e).strip().splitlines()
        errors.print(f"error: {args.src}: {type(e).__name__}: {text[0] if text else ''} (run "
                     "with --debug for the traceback)", markup=False)
        return 1


if __name__ == "__main__":
    if "--debug" not in sys.argv:
        _silence()  # for the whole process: orbax threads may still report at exit
    sys.exit(main())
