"""torch.save files (``.pt``): a PyTorch state_dict, read only with PyTorch's safe loader,
metadata in a JSON sidecar.

Besides tensors and containers, the safe loader accepts only the inert globals of
`SAFE_GLOBALS` (objects training scripts store beside the weights, which hold data and run no
code), and only while this module reads a file: PyTorch's global allowlist is never changed.
Anything else is refused, naming the global. A wrapped file (``{"model": sd, "optimizer": ...}``,
timm's and torchvision's training checkpoints) gives its weights (`converters.checkpoints.unwrap`).
"""

from __future__ import annotations

import argparse
import pathlib
import pickle
import types
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from canonical.torch_arrays import numpy_to_torch
from converters.checkpoints.checkpoint import Checkpoint, Detection, numpy_state, stored_state
from converters.checkpoints.configs import resolve_config
from converters.checkpoints.format import (
    CheckpointFormat,
    Entry,
    ForeignTree,
    Probe,
    checkpoint_bytes,
)
from converters.checkpoints.io import (
    CheckpointError,
    ProgressFn,
    ProgressTask,
    first_line,
)
from converters.checkpoints.metadata import digest_checked, read_sidecar
from converters.checkpoints.staging import HashingFile
from converters.checkpoints.unwrap import Unwrapped, unwrap
from zoo.configs import Config


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise CheckpointError("reading or writing .pt files needs PyTorch: "
                              "pip install 'jax-model-zoo[torch]'") from e
    return torch


DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                 "uint8", "bool")


def _check_zip(path: Path, intact: bool = False) -> None:
    """A torch.save zip whose every member passes its CRC-32 check (torch.load checks none;
    skipped for a file known `intact`: its SHA-256 matched the sidecar's) and claims no more
    bytes than the file holds; CheckpointError otherwise."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as z:
            big = [i.filename for i in z.infolist() if i.file_size > size]
            if big:
                raise CheckpointError(f"{path}: zip member {big[0]!r} claims more bytes than the "
                                      "file holds: corrupted")
            bad = None if intact else z.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError,
            NotImplementedError, RuntimeError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: damaged zip archive ({first_line(e)})") from e
    if bad is not None:
        raise CheckpointError(f"{path}: zip member {bad!r} fails its CRC-32 check: the file is "
                              "corrupted")


def _check_tensors(path: Path, obj: Mapping[str, Any]) -> None:
    torch = _import_torch()
    for k, v in obj.items():
        if v.layout != torch.strided:
            raise CheckpointError(f"{path}: {k!r} is a {v.layout} tensor: only dense tensors "
                                  "are supported")
        if v.device.type == "meta":
            raise CheckpointError(f"{path}: {k!r} is a meta tensor (it holds no data)")
        name = str(v.dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise CheckpointError(f"{path}: {k!r} has dtype {name}, which the zoo does not "
                                  f"store (supported: {', '.join(DTYPES)})")


# Inert globals a torch.save file may hold beside its tensors (training scripts save their
# arguments and paths): building them sets attributes or joins strings, nothing more.
SAFE_GLOBALS: tuple[type, ...] = (argparse.Namespace, types.SimpleNamespace, pathlib.PosixPath,
                                  pathlib.PurePosixPath, pathlib.WindowsPath,
                                  pathlib.PureWindowsPath)


def _load(path: Path, intact: bool = False) -> Any:
    """The object of a torch.save file, read with PyTorch's safe loader (after the zip's CRC
    checks, unless the file is known `intact`), `SAFE_GLOBALS` allowed for this call only."""
    torch = _import_torch()
    mapped = zipfile.is_zipfile(path)  # a zip's tensors are mapped from the file, read lazily
    if mapped:
        _check_zip(path, intact)
    try:
        with torch.serialization.safe_globals(list(SAFE_GLOBALS)):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mapped)
    except pickle.UnpicklingError as e:
        # torch's message wraps the reason in advice to retry unsafely: keep only the reason
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "GLOBAL" in ln or ln.startswith("Unsupported")),
                   "not a plain tensor pickle.")
        raise CheckpointError(
            f"{path}: refused by PyTorch's safe loader (torch.load(weights_only=True)): {why} "
            "The file is corrupted or holds more than tensors and inert objects (e.g. pickled "
            "objects that would run code); this tool never loads it any other way") from e
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the torch.save file ({type(e).__name__}: "
                              f"{first_line(e)}): truncated or corrupted") from e


def load_weights(path: Path, weights: str | None = None, intact: bool = False) -> Unwrapped:
    """The model weights of a torch.save file: a state_dict, or the one found inside a wrapped
    training checkpoint (`weights`: "main" or "ema" where both exist). `intact`: the file is
    the one its sidecar describes (`digest_checked`), its CRC-32s need no second pass."""
    torch = _import_torch()
    obj = _load(path, intact)
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a state_dict")
    found = unwrap(obj, lambda v: isinstance(v, torch.Tensor), str(path), weights)
    _check_tensors(path, found.state)
    return found


def load_state_dict(path: Path) -> dict[str, Any]:
    """The model's tensors of a torch.save file (see `load_weights`)."""
    return load_weights(path).state


class TorchPickle(CheckpointFormat):
    """``torch`` as ``.pt``: ``torch.save(state_dict)``, a zip archive or a legacy pickle."""

    name: ClassVar[str] = "torch"
    variant: ClassVar[str] = "pt"
    suffixes: ClassVar[tuple[str, ...]] = (".pt", ".pth", ".bin")
    sidecar: ClassVar[bool] = True
    writes_layouts: ClassVar[bool] = True  # a state_dict in torchvision's names, ...

    def detect(self, probe: Probe) -> Detection | None:
        head = probe.head
        if head.startswith(b"PK\x03\x04"):
            reason = "zip archive: a torch.save file"
        elif head[:1] == b"\x80":
            reason = "pickle stream: a legacy torch.save file"
        else:
            return None
        meta, note = read_sidecar(probe.path, probe.size)
        return self.detection(reason, meta, note)

    def rejection(self, probe: Probe) -> str:
        return "not a torch.save zip or pickle"

    def damaged(self, probe: Probe) -> str:
        return (f"{probe.path}: not a torch.save file (neither a zip archive nor a pickle "
                "stream): corrupted")

    def read(self, path: Path, det: Detection, given: Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        return self._read(path, det, given, progress, None)

    def read_weights(self, path: Path, det: Detection, given: Config | None,
                     progress: ProgressFn | None, weights: str) -> Checkpoint:
        return self._read(path, det, given, progress, weights)

    def _read(self, path: Path, det: Detection, given: Config | None,
              progress: ProgressFn | None, weights: str | None) -> Checkpoint:
        size = path.stat().st_size
        task = ProgressTask(progress, "reading", size)
        found = load_weights(path, weights, intact=digest_checked(det.meta))
        state = numpy_state(found.state)
        task.advance(size)
        config = resolve_config(path, det.meta, given, list(state))
        return Checkpoint(config, state, notes=(found.note,) if found.note else ())

    def read_tree(self, path: Path, weights: str | None = None) -> ForeignTree:
        found = load_weights(path, weights)
        return ForeignTree(found.state, "torch", True, found.note)  # torch keeps module order

    def save_plain(self, res_state: Mapping[str, Any], model: Any, data: Path) -> None:
        torch = _import_torch()
        torch.save({k: numpy_to_torch(v) for k, v in res_state.items()}, data)

    def refuse(self, ck: Checkpoint) -> None:
        if ck.training:
            raise CheckpointError(
                "the torch format holds a model state_dict only, but this checkpoint has "
                "optimizer state / a step: pass --model-only (model_only=True) to drop them, or "
                "use another format")

    def write(self, ck: Checkpoint, data: Path) -> None:
        with HashingFile(data) as f:
            self._save(ck, f)

    def write_hashed(self, ck: Checkpoint, data: Path, advance: Callable[[int], None]
                     ) -> dict[str, Any]:
        """Hashed as written: torch.save writes a file object front to back, never seeking
        (its zip records are named ``archive/``, as in any torch.save to a buffer)."""
        with HashingFile(data) as f:
            self._save(ck, f)
        advance(checkpoint_bytes(ck))
        return f.digest()

    @staticmethod
    def _save(ck: Checkpoint, f: HashingFile) -> None:
        torch = _import_torch()
        torch.save(OrderedDict((k, numpy_to_torch(v, share=True))
                               for k, v in stored_state(ck).items()), f)

    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        return [(k, tuple(v.shape), str(v.dtype).removeprefix("torch."))
                for k, v in load_state_dict(path).items()]
