"""Foreign checkpoint files: read their trees safely (never unpickling anything), match them to a
zoo architecture or a user's model, verify, and write them with the checkpoint rules
(`converters.checkpoints.destination`: staged, never over what is not ours)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from converters.checkpoints.api import detect_impl
from converters.checkpoints.checkpoint import Checkpoint
from converters.checkpoints.destination import check_pair, publishing
from converters.checkpoints.detect import detect
from converters.checkpoints.format import ForeignTree, for_detection, for_writing
from converters.checkpoints.io import CheckpointError, UsageError
from converters.checkpoints.readwrite import write
from converters.matching.transfer import Result, import_state, transfer
from zoo.configs import Config
from zoo.libraries import IMPLS, library


def read_tree(path: str | os.PathLike, weights: str | None = None) -> ForeignTree:
    """Any checkpoint's arrays under their stored names (a torch.save state_dict or training
    checkpoint through the safe loader, safetensors, an orbax directory restored without a
    target): a question asked of its format class."""
    path = Path(path)
    return for_detection(detect(path)).read_tree(path, weights)


def convert_foreign(src: str | os.PathLike, dst: str | os.PathLike, to: str, config: Config, *,
                    maps: Sequence[str] = (), strip: str = "", add: str = "",
                    verify: bool = True, force: bool = False, cast: Any = None,
                    weights: str | None = None,
                    layout: str | None = None) -> tuple[Checkpoint, Result]:
    """Convert a checkpoint written by other code than the zoo's into zoo architecture
    `config` as format `to`: layers matched (see `converters.matching.match`), outputs of the
    source's and the target's library compared on a random input first (`verify`); `layout`
    as `converters.checkpoints.write`'s."""
    check_pair(src, dst)
    src_tree = read_tree(src, weights)
    res = import_state(src_tree.tree, src_tree.impl, config, maps=maps, strip=strip, add=add,
                       ordered=src_tree.ordered,
                       verify_with=(to if to in IMPLS else _reference()) if verify else None)
    ck = Checkpoint(config, res.state, notes=(src_tree.note,) if src_tree.note else ())
    if cast is not None:
        ck = ck.cast(cast)
    ck.source = detect(src)
    write(ck, dst, to, force=force, source=src, layout=layout)
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
    src_tree = read_tree(src)
    res = transfer(src_tree.tree, src_tree.impl, like, dst_impl, maps=maps, strip=strip,
                   add=add, ordered=src_tree.ordered, input_shape=input_shape,
                   flatten_shape=flatten_shape, verify=False)
    if src_tree.note:
        res.notes.append(src_tree.note)
    res.notes.append("not verified: the source is a file, not a runnable model")
    with publishing(dst, with_sidecar=False, force=force, source=src) as staged:
        for_writing(to, dst).save_plain(res.state, res.model, staged.data)
    return res


def _reference() -> str:
    """The library a canonical file is verified with (PyTorch's layout is the canonical one)."""
    return next(i for i in IMPLS if library(i).reference)
