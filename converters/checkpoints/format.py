"""One class per checkpoint format, and the registry that detection, reading, writing,
`inspect` and the command line consult.

A format is a `CheckpointFormat` subclass registered with `register`: it says whether a path
looks like it (`detect`, with the evidence), reads it into a canonical `Checkpoint` (`read`),
writes one (`write`) and lists what a file stores (`entries`). Adding a format is adding one
class and one `register` call (see `converters.checkpoints.formats`).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from converters.checkpoints.checkpoint import Checkpoint, Detection, Placement
from converters.checkpoints.io import CheckpointError, ProgressFn, UsageError
from converters.checkpoints.metadata import describe
from converters.checkpoints.staging import digest
from zoo.configs import Config

Entry = tuple[str, tuple[int, ...], str]  # (key, shape, dtype name) as `inspect` lists it
T = TypeVar("T")


class Probe:
    """A path under detection: each fact about it computed once, when a format first asks."""

    def __init__(self, path: Path):
        self.path = path
        self._facts: dict[str, Any] = {}

    def fact(self, name: str, compute: Callable[[Path], T]) -> T:
        """`compute(path)`, shared by every format that asks for `name`."""
        if name not in self._facts:
            self._facts[name] = compute(self.path)
        return self._facts[name]

    @property
    def size(self) -> int:
        return self.fact("size", lambda p: p.stat().st_size)

    @property
    def head(self) -> bytes:
        """The first 16 bytes of the file."""
        def read(p: Path) -> bytes:
            with open(p, "rb") as f:
                return f.read(16)
        return self.fact("head", read)


@dataclass(frozen=True)
class ForeignTree:
    """A checkpoint read as a tree of named arrays, for matching its layers (any names):
    the library whose names and layouts it has (`impl`), whether its keys keep definition
    order, and one line on what was left out ("" if nothing)."""

    tree: Mapping[str, Any]
    impl: str
    ordered: bool
    note: str = ""


class CheckpointFormat(ABC):
    """A way of storing a checkpoint on disk, known by its `name` (what ``--to`` says)."""

    name: ClassVar[str]
    variant: ClassVar[str] = ""  # tells apart classes sharing a name (torch: pt, safetensors)
    directory: ClassVar[bool] = False  # a directory, not a single file
    suffixes: ClassVar[tuple[str, ...]] = ()  # file name endings that name this format
    sidecar: ClassVar[bool] = False  # metadata in `<file>.json` beside the data
    keeps_batch_counts: ClassVar[bool] = True  # stores BatchNorm's num_batches_tracked itself
    priority: ClassVar[int] = 0  # tried first when higher (a validated header before a magic)
    holds_any: ClassVar[bool] = True  # any architecture and training state (a hub folder: not)
    carries_config: ClassVar[bool] = False  # its own files give the config (a hub config.json)
    shards: ClassVar[bool] = False  # writes its data split into files of a chosen size
    names_keys: ClassVar[bool] = True  # stores layer names (a foreign tree can be matched)
    writes_layouts: ClassVar[bool] = False  # writes a foreign layout's names (`--layout`)

    @abstractmethod
    def detect(self, probe: Probe) -> Detection | None:
        """A `Detection` stating the evidence when `probe.path` holds this format, else None
        (CheckpointError when it is this format but its metadata is broken)."""

    @abstractmethod
    def rejection(self, probe: Probe) -> str:
        """Why a path this format did not detect is not this format (for the final error)."""

    @abstractmethod
    def read(self, path: Path, det: Detection, given: Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        """The checkpoint at `path` (`given`: the config from --arch/--config, if any)."""

    def read_tree(self, path: Path, weights: str | None = None) -> ForeignTree:
        """The arrays at `path` under their stored names, whatever wrote them (default: this
        format stores no names to match)."""
        self.one_set(path, weights)
        raise CheckpointError(f"{path}: a {self.name} checkpoint stores no layer names, so its "
                              "layers cannot be matched")

    def stored_config(self, path: Path) -> Config | None:
        """The config the files at `path` give (`carries_config`: a hub `config.json`), else
        None, without reading the arrays."""
        del path
        return None

    def one_set(self, path: Path, weights: str | None) -> None:
        """UsageError when --weights chooses among the weights of a format holding one set."""
        if weights is not None:
            raise UsageError(f"--weights {weights}: {path} is a {self.name} checkpoint, which "
                             "holds one set of weights")

    def save_plain(self, res_state: Mapping[str, Any], model: Any, data: Path) -> None:
        """Store a matched result without metadata: `res_state` (canonical names) or the
        native `model` of this format's library (default: this format cannot)."""
        del res_state, model, data
        raise UsageError(f"a {self.name} checkpoint cannot be written without its config")

    def read_weights(self, path: Path, det: Detection, given: Config | None,
                     progress: ProgressFn | None, weights: str) -> Checkpoint:
        """`read`, choosing the live ("main") or EMA ("ema") weights where the file holds
        both (default: a format that holds one set of weights refuses the choice)."""
        self.one_set(path, weights)
        return self.read(path, det, given, progress)

    def read_placed(self, path: Path, det: Detection, given: Config | None,
                    progress: ProgressFn | None, placement: Placement) -> Checkpoint:
        """`read`, with the arrays restored straight onto `placement`'s devices where the
        format can (default: read to the host; `converters.load` places the model after)."""
        del placement
        return self.read(path, det, given, progress)

    @abstractmethod
    def write(self, ck: Checkpoint, data: Path) -> None:
        """Store the validated `ck` at `data` (a staged path; the sidecar is written apart)."""

    @abstractmethod
    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        """What the file stores, key by key (`ck`: the checkpoint read from it, if it loads)."""

    def write_counted(self, ck: Checkpoint, data: Path, advance: Callable[[int], None]) -> None:
        """`write`, telling `advance` the bytes of each array as it is written (default: all
        of them at the end; a format that streams tensor by tensor overrides this)."""
        self.write(ck, data)
        advance(checkpoint_bytes(ck))

    def write_hashed(self, ck: Checkpoint, data: Path, advance: Callable[[int], None]
                     ) -> dict[str, Any]:
        """`write_counted`, returning the size and SHA-256 its sidecar records (default: the
        written file read back; a format writing one file front to back hashes the bytes as
        they pass, through a `staging.HashingFile`)."""
        self.write_counted(ck, data, advance)
        return digest(data)

    def sized(self, max_bytes: int) -> CheckpointFormat:
        """This format writing shards of at most `max_bytes` (only a format with `shards`)."""
        raise UsageError(f"the {self.name} format cannot be written in shards")

    def damaged(self, probe: Probe) -> str:
        """The error for a file named like this format (`suffixes`) that it did not detect."""
        return f"{probe.path}: {self.rejection(probe)}: truncated or corrupted"

    def refuse(self, ck: Checkpoint) -> None:
        """CheckpointError when this format cannot hold `ck` as it is (default: it can)."""
        del ck

    def metadata(self, ck: Checkpoint) -> dict[str, Any]:
        """Our JSON metadata of `ck` in this format (the sidecar, ``zoo.json``)."""
        return describe(ck, self.name, with_batch_counts=not self.keeps_batch_counts)

    def detection(self, reason: str, meta: dict[str, Any] | None = None,
                  note: str = "") -> Detection:
        return Detection(self.name, reason, meta, self.variant, note)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}{', ' + self.variant if self.variant else ''})"


_REGISTRY: list[CheckpointFormat] = []


def register(fmt: CheckpointFormat) -> CheckpointFormat:
    """Add a format; the pair (name, variant) must be new."""
    if any((f.name, f.variant) == (fmt.name, fmt.variant) for f in _REGISTRY):
        raise ValueError(f"a format {fmt.name!r} {fmt.variant!r} is registered already")
    _REGISTRY.append(fmt)
    return fmt


def registered() -> tuple[CheckpointFormat, ...]:
    """Every format, in the order detection tries them (`priority`, then registration)."""
    return tuple(sorted(_REGISTRY, key=lambda f: -f.priority))


def format_names(*, holding_any: bool = False) -> tuple[str, ...]:
    """The names ``--to`` accepts, in registration order (`holding_any`: only the formats that
    hold every architecture and training state)."""
    return tuple(dict.fromkeys(f.name for f in _REGISTRY if f.holds_any or not holding_any))


def for_detection(det: Detection) -> CheckpointFormat:
    """The format class that made `det`."""
    for f in _REGISTRY:
        if (f.name, f.variant) == (det.fmt, det.variant):
            return f
    raise CheckpointError(f"no format {det.fmt!r} {det.variant!r} is registered")


def for_writing(name: str, dst: str | os.PathLike,
                shard_bytes: int | None = None) -> CheckpointFormat:
    """The class that writes format `name` at `dst`: the one whose suffix `dst` has, else the
    first registered; with `shard_bytes`, the one that writes shards of at most that size. A
    `dst` whose extension names another format is refused (UsageError)."""
    if name not in format_names():
        raise UsageError(f"unknown format {name!r}; formats: {list(format_names())}")
    sharded = shard_bytes is not None
    candidates = [f for f in _REGISTRY if f.name == name and f.shards == sharded
                  and (f.directory or not sharded)]
    if not candidates:
        raise UsageError(f"the {name} format cannot be written in shards (--shard-size)")
    if sharded:
        return candidates[0].sized(shard_bytes)
    dst = Path(dst)
    suffix = dst.suffix.lower()
    own = [f for f in candidates if suffix in f.suffixes]
    if own:
        return own[0]
    others = list(dict.fromkeys(f.name for f in _REGISTRY if suffix and suffix in f.suffixes))
    if others:
        want = _suffixes(name)
        raise UsageError(
            f"refusing to write {dst} as {name}: the extension {dst.suffix} names the "
            f"{' or '.join(others)} format" + (f"; name it *{' or *'.join(want)}" if want else
                                               f"; {name} writes a directory: name it without "
                                               f"{dst.suffix}"))
    return candidates[0]


def checkpoint_bytes(ck: Checkpoint) -> int:
    """The bytes of every array of `ck` (model and optimizer)."""
    arrays = [*ck.state.values(), *(ck.optimizer.arrays.values() if ck.optimizer else ())]
    return sum(int(np.prod(np.shape(a))) * np.dtype(a.dtype).itemsize for a in arrays)


def foreign_suffix(fmt: CheckpointFormat, dst: str | os.PathLike) -> str | None:
    """A warning when `dst` has an extension that is not one of a single-file format's own
    (e.g. ``out.txt`` for torch); None when the name is as expected or has no extension."""
    suffix = Path(dst).suffix.lower()
    if fmt.directory or not suffix or not fmt.suffixes or suffix in fmt.suffixes:
        return None
    return (f"{dst}: a {fmt.name} file is usually named *{' or *'.join(_suffixes(fmt.name))}, "
            f"not *{Path(dst).suffix}")


def _suffixes(name: str) -> list[str]:
    return list(dict.fromkeys(s for f in _REGISTRY if f.name == name for s in f.suffixes))
