"""The command line's side of matching: print the mapping table, convert a checkpoint the
zoo did not write (`--arch`, or `--like` for a user's own model), propose a mapping in
`inspect`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from canonical.errors import ConversionError, StateMismatchError
from converters import adapters
from converters.checkpoints import Report
from converters.checkpoints.checkpoint import Detection
from converters.checkpoints.configs import parse_config
from converters.checkpoints.detect import detect
from converters.checkpoints.format import for_detection
from converters.checkpoints.io import CheckpointError, UsageError
from converters.matching.files import convert_foreign, convert_like, load_like, read_tree
from converters.matching.hint import hint
from converters.matching.match import MatchError, render
from converters.matching.transfer import Result, import_state, source_layers
from zoo.configs import Config


def describe(console: Console, ck: Any) -> None:
    console.print(f"  architecture: {ck.config.arch} {ck.config.to_json()}", highlight=False)
    kind = (f"training checkpoint (step {ck.step}, optimizer state "
            f"{'yes' if ck.optimizer is not None else 'no'})" if ck.training else "model")
    console.print(f"  contents: {kind}, {len(ck.state)} keys, dtype {ck.dtype}")
    describe_layout(console, ck)


def describe_layout(console: Console, ck: Any) -> None:
    """What was left out on reading, and the foreign layout read through (if any)."""
    for note in ck.notes:
        console.print(f"  note: {note}", markup=False)
    if ck.layout:
        layout = adapters.get(ck.layout)
        console.print(f"  layout: {layout.description} ({layout.name}), keys renamed and fused "
                      "by its declared rules", markup=False)
        console.print(f"  checked: the layout (every key and shape fits {ck.config.arch}; "
                      "evidence: name, shape); not checked: the outputs against the source "
                      "model (only a file was given)", markup=False)


def print_mapping(console: Console, res: Result, show: bool) -> None:
    """The mapping table (when asked, or when some layer was not matched by its name), the
    flatten fact and the verification."""
    if show or res.structural:
        table = Table(title=f"layer mapping ({len(res.rows)} layers)")
        for col in ("source", "target", "kind", "source shape", "target shape", "rule"):
            table.add_column(col)
        for r in res.rows:
            table.add_row(r.source, r.target, r.kind, str(r.source_shape), str(r.target_shape),
                          r.rule)
        wide = console.options.update(max_width=1 << 16)
        if Measurement.get(console, wide, table).maximum <= console.width:
            console.print(table)
        else:  # a narrow terminal would wrap the cells: plain aligned text never does
            console.print(f"layer mapping ({len(res.rows)} layers)\n{render(res.rows)}",
                          markup=False)
    if res.flatten_from:
        console.print(f"  flattened map (C, *spatial) = {res.flatten_shape}, from the "
                      f"{res.flatten_from}")
    if res.max_difference is not None:
        diff = (f"{res.max_difference:.3g} (max |a - b| / max |a|; tolerance "
                f"{res.tolerance:.3g})")
        if res.source_ran:
            console.print(f"  verified: {res.compared} differ by {diff}", markup=False)
        else:
            evidence = ", ".join(dict.fromkeys(r.rule.split(" ")[0] for r in res.rows))
            console.print(f"  checked: the layout ({res.compared} differ by {diff}); not "
                          f"checked: the mapping (evidence used: {evidence}; the source model "
                          "did not run, only a file was given)", markup=False)
    for note in res.notes:
        console.print(f"  {note}", markup=False)


def mismatch_hint(error: Exception, args: argparse.Namespace, det: Detection) -> str:
    """For a conversion of a file without our metadata that failed on its keys or shapes
    (`StateMismatchError`, `MatchError`, also as a cause): the line naming the named models
    of the architecture the file fits ("" if none, or another failure)."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, StateMismatchError | MatchError):
        cause = cause.__cause__
    if cause is None or det.meta is not None or args.like or not args.arch:
        return ""
    config, base = parse_config(args.arch, args.config), parse_config(args.arch)
    try:
        tree = read_tree(args.src, args.weights)
        sources, _ = source_layers(tree.tree, tree.impl)
    except (CheckpointError, ConversionError, UsageError):
        return ""
    return hint(sources, config, base) if config is not None else ""


def stored_config(src: str) -> Config | None:
    """The config a source's own files give (a hub folder's `config.json`), if any."""
    return for_detection(detect(src)).stored_config(Path(src))


def convert_foreign_cli(args: argparse.Namespace, console: Console) -> int:
    config = parse_config(args.arch, args.config) or stored_config(args.src)
    if config is None:
        raise UsageError("a checkpoint the zoo did not write is matched to an architecture: "
                         "pass --arch (and --config), or --like MODULE:ATTR")
    ck, res = convert_foreign(args.src, args.dst, args.to, config, maps=args.map,
                              strip=args.strip_prefix, add=args.add_prefix, verify=args.verify,
                              force=args.force, cast=args.cast, weights=args.weights,
                              layout=args.layout)
    if not args.verify:
        res.notes.append("not verified (--no-verify)")
    print_mapping(console, res, args.show_mapping)
    describe(console, ck)
    console.print(f"wrote {args.dst} as [bold]{args.to}[/bold]")
    return 0


def _shape(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise UsageError(f"{flag} {text!r}: expected positive integers like 1,28,28")
    return shape


def convert_like_cli(args: argparse.Namespace, console: Console) -> int:
    if args.arch or args.config:
        raise UsageError("--like replaces --arch/--config: give one or the other")
    if args.layout:
        raise UsageError("--layout writes a zoo architecture's state_dict in a foreign layout; "
                         "--like writes your own model's names")
    res = convert_like(args.src, args.dst, args.to, load_like(args.like), maps=args.map,
                       strip=args.strip_prefix, add=args.add_prefix,
                       input_shape=_shape(args.input_shape, "--input-shape"),
                       flatten_shape=_shape(args.flatten_shape, "--flatten-shape"),
                       force=args.force)
    print_mapping(console, res, args.show_mapping)
    console.print(f"wrote {args.dst} as [bold]{args.to}[/bold] ({len(res.state)} arrays)")
    return 0


def propose(args: argparse.Namespace, r: Report, console: Console) -> int:
    """The mapping of a checkpoint written by other code to the given architecture."""
    src = read_tree(args.src)
    try:
        res = import_state(src.tree, src.impl, r.config, maps=args.map, strip=args.strip_prefix,
                           add=args.add_prefix, ordered=src.ordered)
    except MatchError as m:
        raise CheckpointError(f"{r.problem}\nmatching the layers by structure failed too: {m}"
                              ) from m
    print_mapping(console, res, True)
    flags = [f"--arch {r.config.arch}"]
    if r.config != type(r.config)():
        flags.append(f"--config '{r.config.to_json()}'")
    flags += [f"--map '{m}'" for m in args.map]
    flags += [f"--{k.replace('_', '-')} '{v}'" for k, v in (("strip_prefix", args.strip_prefix),
                                                          ("add_prefix", args.add_prefix)) if v]
    console.print("converts with this mapping: python -m converters convert "
                  f"{args.src} DST --to FORMAT {' '.join(flags)}", markup=False)
    return 0
