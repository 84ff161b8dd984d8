"""NumPy ``.npz`` archives (``np.savez(path, **state_dict)``): canonical names and layouts,
read with ``np.load(allow_pickle=False)`` (no pickled object is ever loaded), metadata in a
JSON sidecar."""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from converters.checkpoints.checkpoint import Checkpoint, Detection, ordered_state
from converters.checkpoints.configs import resolve_config
from converters.checkpoints.format import CheckpointFormat, Entry, ForeignTree, Probe
from converters.checkpoints.io import CheckpointError, ProgressFn, ProgressTask, first_line
from converters.checkpoints.metadata import read_sidecar
from zoo.configs import Config


def _members(path: Path) -> list[str] | None:
    """The member names of a zip archive whose every member is a ``.npy`` array, else None."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    return names if names and all(n.endswith(".npy") for n in names) else None


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file in stored order; CheckpointError naming the first entry
    that is not a plain numeric array (a pickled object, a structured or void dtype)."""
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(path, allow_pickle=False) as npz:
            for key in npz.files:
                try:
                    arrays[key] = npz[key]
                except ValueError as e:
                    raise CheckpointError(f"{path}: entry {key!r} is not a plain array "
                                          f"({first_line(e)}); pickled objects are never "
                                          "loaded") from e
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the .npz archive ({type(e).__name__}: "
                              f"{first_line(e)}): truncated or corrupted") from e
    odd = [k for k, v in arrays.items() if v.dtype.kind not in "biuf"]
    if odd:
        raise CheckpointError(f"{path}: entry {odd[0]!r} has dtype {arrays[odd[0]].dtype}, not "
                              "a numeric dtype a checkpoint stores")
    return arrays


class Npz(CheckpointFormat):
    """``npz``: a zip of ``.npy`` arrays under canonical names (PyTorch's layout)."""

    name: ClassVar[str] = "npz"
    suffixes: ClassVar[tuple[str, ...]] = (".npz",)
    sidecar: ClassVar[bool] = True
    priority: ClassVar[int] = 1  # a zip of .npy members before the torch.save zip

    def detect(self, probe: Probe) -> Detection | None:
        if not probe.head.startswith(b"PK\x03\x04"):
            return None
        members = probe.fact("npz", _members)
        if members is None:
            return None
        meta, note = read_sidecar(probe.path, probe.size)
        return self.detection(f"zip archive of {len(members)} .npy arrays: a NumPy .npz file",
                              meta, note)

    def rejection(self, probe: Probe) -> str:
        return "not a zip of .npy arrays (.npz)"

    def read(self, path: Path, det: Detection, given: Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        task = ProgressTask(progress, "reading", 1)
        state = load_arrays(path)
        task.advance()
        return Checkpoint(resolve_config(path, det.meta, given, list(state)), state)

    def read_tree(self, path: Path, weights: str | None = None) -> ForeignTree:
        self.one_set(path, weights)
        return ForeignTree(load_arrays(path), "torch", True)  # np.savez keeps argument order

    def refuse(self, ck: Checkpoint) -> None:
        if ck.training:
            raise CheckpointError(
                "the npz format holds model arrays only, but this checkpoint has optimizer "
                "state / a step: pass --model-only (model_only=True) to drop them")
        if ck.dtype.kind not in "biuf":  # bfloat16 is a void dtype to NumPy
            raise CheckpointError(f"NumPy's .npz cannot store {ck.dtype} arrays (it would "
                                  "need pickles): pass --cast float32 (cast='float32')")

    def write(self, ck: Checkpoint, data: Path) -> None:
        self.save_plain(ordered_state(ck), None, data)

    def save_plain(self, res_state: Mapping[str, Any], model: Any, data: Path) -> None:
        with open(data, "wb") as f:  # a file object: np.savez adds no ".npz" to the name
            np.savez(f, **{k: np.asarray(v) for k, v in res_state.items()})

    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        return [(k, tuple(v.shape), str(v.dtype)) for k, v in load_arrays(path).items()]
