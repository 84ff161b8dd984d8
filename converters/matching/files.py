"""Foreign checkpoint files: read their trees safely (never unpickling anything), match them to a
zoo architecture or a user's model, verify, and write them with the checkpoint rules
(`converters.checkpoints.destination`: staged, never over what is not ours)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from canonical.torch_arrays import numpy_to_torch
from converters.checkpoints.api import detect_impl
from converters.checkpoints.base import Checkpoint, Detection
from converters.checkpoints.destination import check_pair, publishing
from converters.checkpoints.detect import detect
from converters.checkpoints.format import for_writing
from converters.checkpoints.formats.orbax_io import restore
from converters.checkpoints.formats.torch_pickle import load_state_dict
from converters.checkpoints.io import CheckpointError, UsageError
from converters.checkpoints.readwrite import write
from converters.matching.transfer import Result, import_state, transfer
from zoo.configs import Config
from zoo.interface import native_interface
from zoo.libraries import IMPLS, library


def read_tree(path: str | os.PathLike) -> tuple[Any, str, bool, Detection]:
    """(tree of arrays, library, whether its keys keep definition order, detection) of any
    checkpoint file: a torch.save state_dict (safe loader), safetensors, an orbax directory of
    Linen variables or an NNX state (restored without a target: any names)."""
    path = Path(path)
    det = detect(path)
    if det.fmt in ("torch", "canonical"):
        if det.variant == "safetensors":
            from safetensors.numpy import load_file

            try:
                return load_file(str(path)), "torch", False, det  # stored sorted by name
            except Exception as e:
                raise CheckpointError(f"{path}: cannot read the safetensors file ({e})") from e
        return load_state_dict(path), "torch", True, det
    if det.fmt in ("linen", "nnx"):
        return restore(path), det.fmt, False, det
    raise CheckpointError(f"{path}: an Equinox leaf file stores no names, so its layers cannot be "
                          "matched: load it into its own model and use converters.transfer")


def convert_foreign(src: str | os.PathLike, dst: str | os.PathLike, to: str, config: Config, *,
                    maps: Sequence[str] = (), strip: str = "", add: str = "",
                    verify: bool = True, force: bool = False, cast: Any = None
                    ) -> tuple[Checkpoint, Result]:
    """Convert a checkpoint written by other code than the zoo's into zoo architecture
    `config` as format `to`: layers matched (see `converters.matching.match`), outputs of the
    source's and the target's library compared on a random input first (`verify`)."""
    check_pair(src, dst)
    tree, impl, ordered, det = read_tree(src)
    res = import_state(tree, impl, config, maps=maps, strip=strip, add=add, ordered=ordered,
                       verify_with=(to if to in IMPLS else _reference()) if verify else None)
    ck = Checkpoint(config, res.state)
    if cast is not None:
        ck = ck.cast(cast)
    ck.source = det
    write(ck, dst, to, force=force, source=src)
    return ck, res


def load_like(spec: str) -> Any:
    """The model named by ``MODULE:ATTR`` (an object, or a function of no arguments making one)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise UsageError(f"--like {spec!r}: expected MODULE:ATTR (e.g. mymodels:skeleton)")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise UsageError(f"--like {spec!r}: cannot import {module!r} ({e})") from e
    except AttributeError as e:
        raise UsageError(f"--like {spec!r}: {module!r} has no attribute {attr!r}") from e
    if callable(obj) and not _is_model(obj):
        obj = obj()
    return obj


def _is_model(obj: Any) -> bool:
    try:
        detect_impl(obj)
    except CheckpointError:
        return False
    return True


def convert_like(src: str | os.PathLike, dst: str | os.PathLike, to: str, like: Any, *,
                 maps: Sequence[str] = (), strip: str = "", add: str = "",
                 input_shape: tuple[int, ...] | None = None,
                 flatten_shape: tuple[int, ...] | None = None,
                 force: bool = False) -> Result:
    """Convert a checkpoint into the weights of a user's own model `like` (no zoo config),
    written as that model's library (`to` = its library) or as a state_dict with its
    canonical names (`to` = "torch" or "canonical")."""
    check_pair(src, dst)
    dst_impl = detect_impl(like)
    if to not in (dst_impl, "torch", "canonical"):
        raise UsageError(f"--like gives a {dst_impl} model: write it --to {dst_impl}, torch or "
                         "canonical")
    tree, impl, ordered, _ = read_tree(src)
    res = transfer(tree, impl, like, dst_impl, maps=maps, strip=strip, add=add, ordered=ordered,
                   input_shape=input_shape, flatten_shape=flatten_shape, verify=False)
    res.notes.append("not verified: the source is a file, not a runnable model")
    with publishing(dst, with_sidecar=False, force=force, source=src) as staged:
        _save_native(res, to, dst_impl, staged.data, Path(dst))
    return res


def _save_native(res: Result, to: str, impl: str, path: Path, dst: Path) -> None:
    """Write the result into `path`, the staged data of `dst`."""
    if to == "torch" and dst.suffix.lower() != ".safetensors":
        import torch

        torch.save({k: numpy_to_torch(v) for k, v in res.state.items()}, path)
        return
    if to in ("torch", "canonical"):
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in res.state.items()}, str(path))
        return
    for_writing(impl, dst).save_tree(native_interface(impl).checkpoint_tree(res.model), path)


def _reference() -> str:
    """The library a canonical file is verified with (PyTorch's layout is the canonical one)."""
    return next(i for i in IMPLS if library(i).reference)
