"""Sharded safetensors as Hugging Face writes them: ``model-00001-of-0000n.safetensors`` files
and ``model.safetensors.index.json`` (``weight_map``: key -> file) in one folder. Read from the
folder or the index file itself; written as a folder, shards of at most a chosen size."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from converters.checkpoints.checkpoint import Checkpoint, Detection
from converters.checkpoints.format import CheckpointFormat, Entry, Probe
from converters.checkpoints.formats.safetensors import (
    DTYPES,
    Header,
    Safetensors,
    header_meta,
    read_header,
)
from converters.checkpoints.formats.safetensors_io import (
    index_json,
    mapped_tensors,
    nbytes,
    plan_shards,
    shard_names,
    write_stream,
)
from converters.checkpoints.io import CheckpointError, ProgressFn
from zoo.configs import Config

INDEX = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 5 * 10**9  # HF's default max_shard_size


class Index:
    """A validated index: its path, which shard holds each key, and each shard's header."""

    def __init__(self, path: Path):
        self.path = path
        try:
            raw = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise CheckpointError(f"{path}: unreadable safetensors index ({e})") from e
        wmap = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(wmap, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in wmap.items()):
            raise CheckpointError(f"{path}: a safetensors index needs a 'weight_map' object of "
                                  "key -> shard file name")
        self.weight_map: dict[str, str] = wmap
        self.headers: dict[str, Header] = {}
        for name in dict.fromkeys(wmap.values()):
            shard = path.parent / name
            if Path(name).name != name or not shard.is_file():
                raise CheckpointError(f"{path}: shard {name!r} is not a file beside the index")
            header, why_not = read_header(shard)
            if header is None:
                raise CheckpointError(f"{shard}: not a valid safetensors shard ({why_not}): "
                                      "truncated or corrupted")
            listed = {k for k, v in wmap.items() if v == name}
            held = set(header) - {"__metadata__"}
            if listed != held:
                odd = sorted(listed ^ held)[:5]
                raise CheckpointError(f"{path}: the index and shard {name!r} disagree about "
                                      f"the keys {odd}")
            self.headers[name] = header

    def meta(self) -> dict[str, Any] | None:
        """Our metadata, from the first shard's header (every shard we write carries it)."""
        first = next(iter(self.headers), None)
        return None if first is None else header_meta(self.path.parent / first,
                                                      self.headers[first])

    def arrays(self) -> dict[str, np.ndarray]:
        """Every tensor, mapped from its shard (nothing read until used)."""
        out: dict[str, np.ndarray] = {}
        for name, header in self.headers.items():
            out.update(mapped_tensors(self.path.parent / name, header))
        return out


def _index_path(path: Path) -> Path | None:
    """The index of a folder (HF's name, else the only ``*.safetensors.index.json``) or the
    path itself when it is a JSON file with a ``weight_map``."""
    if path.is_dir():
        if (path / INDEX).is_file():
            return path / INDEX
        found = sorted(path.glob("*.safetensors.index.json"))
        return found[0] if len(found) == 1 else None
    if path.name.endswith(".safetensors.index.json"):
        return path  # HF's name: damage in it is reported as such
    if path.name.endswith(".json") and path.stat().st_size < 100 * 2**20:
        with open(path, "rb") as f:
            if b'"weight_map"' in f.read():
                return path
    return None


def _probed(probe: Probe) -> tuple[Index | None, dict[str, Any] | None]:
    def compute(path: Path) -> tuple[Index | None, dict[str, Any] | None]:
        index = _index_path(path)
        if index is None:
            return None, None
        idx = Index(index)
        return idx, idx.meta()
    return probe.fact("safetensors-index", compute)


class ShardedSafetensors(Safetensors):
    """Safetensors split in shards listed by an index; `canonical` says which zoo format (our
    metadata naming ``canonical``) the class detects."""

    variant: ClassVar[str] = "sharded"
    directory: ClassVar[bool] = True
    suffixes: ClassVar[tuple[str, ...]] = ()
    shards: ClassVar[bool] = True
    canonical: ClassVar[bool] = False
    max_bytes: int = DEFAULT_SHARD_BYTES

    def detect(self, probe: Probe) -> Detection | None:
        index, meta = _probed(probe)
        if index is None or (meta is not None and meta.get("format") == "canonical"
                             ) != self.canonical:
            return None
        shards = len(index.headers)
        return self.detection(f"{index.path.name}: a safetensors index of {shards} shard(s)"
                              + (" with zoo metadata" if meta else ""), meta)

    def rejection(self, probe: Probe) -> str:
        return (f"no {INDEX} (sharded safetensors)" if self.directory
                else "not a safetensors index (no weight_map)")

    def damaged(self, probe: Probe) -> str:
        return f"{probe.path}: not a valid safetensors index"

    def read(self, path: Path, det: Detection, given: Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        index = _index_path(path)
        if index is None:
            raise CheckpointError(f"{path}: no safetensors index found")
        return self.assemble(path, det, given, Index(index).arrays())

    def sized(self, max_bytes: int) -> CheckpointFormat:
        fmt = copy.copy(self)
        fmt.max_bytes = max_bytes
        return fmt

    def write_counted(self, ck: Checkpoint, data: Path, advance: Callable[[int], None]) -> None:
        arrays = self.arrays(ck)
        groups = plan_shards(arrays, self.max_bytes)
        names = shard_names(len(groups))
        meta = self.header_metadata(ck)
        data.mkdir()
        total = 0
        for name, keys in zip(names, groups, strict=True):
            shard = {k: arrays[k] for k in keys}
            write_stream(data / name, shard, meta, advance)
            total += nbytes(shard)
        weight_map = {k: name for name, keys in zip(names, groups, strict=True) for k in keys}
        (data / INDEX).write_text(index_json(weight_map, total))

    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        index = _index_path(path)
        if index is None:
            raise CheckpointError(f"{path}: no safetensors index found")
        return [(k, tuple(t["shape"]), DTYPES.get(t["dtype"], t["dtype"].lower()))
                for header in Index(index).headers.values()
                for k, t in header.items() if k != "__metadata__"]


class CanonicalShards(ShardedSafetensors):
    """``canonical`` in shards: a folder."""

    name: ClassVar[str] = "canonical"
    canonical: ClassVar[bool] = True


class CanonicalShardIndex(CanonicalShards):
    """``canonical`` in shards, named by its index file."""

    variant: ClassVar[str] = "sharded-index"
    directory: ClassVar[bool] = False


class TorchShards(ShardedSafetensors):
    """``torch`` in shards (a PyTorch state_dict as HF writes big ones): a folder."""

    name: ClassVar[str] = "torch"


class TorchShardIndex(TorchShards):
    """``torch`` in shards, named by its index file."""

    variant: ClassVar[str] = "sharded-index"
    directory: ClassVar[bool] = False
