"""Flax msgpack files (``flax.serialization.to_bytes(variables)``, or of a `TrainState`, as
``flax.training.checkpoints`` writes them without orbax): restored with
``flax.serialization.msgpack_restore``, which builds only dicts, numbers and arrays (no pickle,
no code). Linen variables; a training tree gives its variables (`unwrap_variables`), its
optimizer state and step are left out and said so. Metadata in a JSON sidecar."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import jax
import numpy as np

from canonical.errors import KeyMismatchError, StateMismatchError
from converters.checkpoints.checkpoint import Checkpoint, Detection, numpy_state
from converters.checkpoints.configs import resolve_config
from converters.checkpoints.format import Entry, ForeignTree, Probe
from converters.checkpoints.formats.native import NativeFormat, most_common, with_dtype
from converters.checkpoints.io import CheckpointError, ProgressFn, ProgressTask, first_line
from converters.checkpoints.metadata import read_sidecar, restore_num_batches_tracked
from converters.checkpoints.unwrap import unwrap_variables
from converters.core import to_canonical
from zoo.configs import Config
from zoo.registry import skeleton

_MAPS = (*range(0x81, 0x90), 0xDE, 0xDF)  # a msgpack map (fixmap of 1..15 entries, map16/32)
_STRS = (*range(0xA0, 0xC0), 0xD9, 0xDA)  # a msgpack string (fixstr, str8, str16)


def restore_file(path: Path) -> Any:
    """The tree of a Flax msgpack file; CheckpointError when it is not one."""
    from flax import serialization

    try:
        tree = serialization.msgpack_restore(path.read_bytes())
    except OSError:
        raise
    except Exception as e:
        raise CheckpointError(f"{path}: not a valid Flax msgpack file ({type(e).__name__}: "
                              f"{first_line(e)}): truncated or corrupted") from e
    if not isinstance(tree, dict):
        raise CheckpointError(f"{path}: holds a msgpack {type(tree).__name__}, not a tree")
    return tree


def _restored(path: Path) -> Any:
    try:
        return restore_file(path)
    except CheckpointError:
        return None


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}/").items()}
    return {prefix[:-1]: tree}


class FlaxMsgpack(NativeFormat):
    """``msgpack``: Linen variables serialized by ``flax.serialization.to_bytes``."""

    name: ClassVar[str] = "msgpack"
    suffixes: ClassVar[tuple[str, ...]] = (".msgpack",)
    sidecar: ClassVar[bool] = True

    @property
    def impl(self) -> str:
        return "linen"  # the library whose variables Flax serializes

    def detect(self, probe: Probe) -> Detection | None:
        head = probe.head
        if len(head) < 2 or head[0] not in _MAPS or head[1] not in _STRS:
            return None
        if probe.fact("msgpack", _restored) is None:
            return None
        meta, note = read_sidecar(probe.path, probe.size)
        return self.detection("msgpack map of arrays: a Flax serialization file", meta, note)

    def rejection(self, probe: Probe) -> str:
        return "not a Flax msgpack tree"

    def read(self, path: Path, det: Detection, given: Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        return self.read_weights(path, det, given, progress, None)

    def read_weights(self, path: Path, det: Detection, given: Config | None,
                     progress: ProgressFn | None, weights: str | None) -> Checkpoint:
        task = ProgressTask(progress, "reading", 1)
        found = unwrap_variables(restore_file(path), str(path), weights)
        task.advance()
        config = resolve_config(path, det.meta, given)
        stored = _flat(found.state)
        floats = [np.asarray(v).dtype for v in stored.values()
                  if np.issubdtype(np.asarray(v).dtype, np.floating)]
        dtype = most_common(floats)
        module, abstract = with_dtype(skeleton(config, self.impl, dtype), dtype)
        want = {k: tuple(v.shape) for k, v in _flat(abstract).items()}
        got = {k: tuple(np.shape(v)) for k, v in stored.items()}
        if set(want) != set(got):
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            raise KeyMismatchError(
                f"{path} does not hold the Linen variables of {config.arch} {config.to_json()}: "
                f"missing {missing[:5]} ({len(missing)}), unexpected {extra[:5]} ({len(extra)})")
        bad = [f"{k}: {got[k]} != {want[k]}" for k in want if got[k] != want[k]]
        if bad:
            raise StateMismatchError(f"{path}: shapes differ from {config.arch} "
                                  f"{config.to_json()}: " + "; ".join(bad[:5]))
        state = numpy_state(to_canonical((module, found.state), self.impl))
        restore_num_batches_tracked(state, det.meta)
        return Checkpoint(config, state, notes=(found.note,) if found.note else ())

    def read_tree(self, path: Path, weights: str | None = None) -> ForeignTree:
        found = unwrap_variables(restore_file(path), str(path), weights)
        return ForeignTree(found.state, self.impl, False, found.note)

    def refuse(self, ck: Checkpoint) -> None:
        super().refuse(ck)
        if ck.training:
            raise CheckpointError(
                "the msgpack format holds Linen variables only, but this checkpoint has "
                "optimizer state / a step: pass --model-only (model_only=True) to drop them")

    def write(self, ck: Checkpoint, data: Path) -> None:
        self.save_tree(self.native(ck)[0][1], data)

    def save_tree(self, tree: Any, path: Path) -> None:
        from flax import serialization

        path.write_bytes(serialization.to_bytes(jax.device_get(dict(tree))))

    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        return [(k, tuple(np.shape(v)), str(np.asarray(v).dtype))
                for k, v in _flat(restore_file(path)).items()]
