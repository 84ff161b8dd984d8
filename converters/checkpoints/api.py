"""The public checkpoint API: `save`, `load`, `convert_file`, `save_canonical`, `load_canonical`."""


from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from converters.checkpoints.checkpoint import Checkpoint, Placement, numpy_state
from converters.checkpoints.configs import parse_config
from converters.checkpoints.destination import check_pair
from converters.checkpoints.format import for_writing
from converters.checkpoints.io import CheckpointError, ProgressFn
from converters.checkpoints.readwrite import read, shard_bytes, write
from converters.checkpoints.sources import local
from converters.core import config_of, to_canonical
from converters.optim import CanonicalOptState, to_canonical_opt
from zoo.configs import Config
from zoo.libraries import owner
from zoo.names import list_models, make_config
from zoo.runtime import sharding


def detect_impl(obj: Any) -> str:
    """Which library a native model object belongs to."""
    if (lib := owner(obj)) is None:
        raise CheckpointError(f"cannot tell which library a {type(obj).__name__} belongs to: "
                              "pass a native model, a canonical state dict or a Checkpoint")
    return lib.name


def as_checkpoint(obj: Any, *, impl: str | None = None, config: Any = None,
                  opt_state: Any = None, step: int | None = None) -> Checkpoint:
    """A canonical Checkpoint from a Checkpoint, a canonical state (plus `config`) or a native
    model (plus an optax `opt_state` built for ``zoo.interface(impl).split(model)[1]``)."""
    if isinstance(obj, Checkpoint):
        if opt_state is not None or step is not None:
            obj = dataclasses.replace(obj, step=step if step is not None else obj.step)
            if opt_state is not None:
                if not isinstance(opt_state, CanonicalOptState):
                    raise CheckpointError("a Checkpoint takes a CanonicalOptState")
                obj.optimizer = opt_state
        return obj
    if isinstance(obj, Mapping):
        cfg = (make_config(config) if isinstance(config, str) and config in list_models()
               else parse_config(None, config))
        if cfg is None:
            raise CheckpointError("saving a canonical state needs its config")
        if opt_state is not None and not isinstance(opt_state, CanonicalOptState):
            raise CheckpointError("with a canonical state, pass opt_state as a CanonicalOptState")
        return Checkpoint(cfg, numpy_state(obj), opt_state, step)
    impl = impl or detect_impl(obj)
    cfg = config_of(obj, impl)
    state = numpy_state(to_canonical(obj, impl), keep_sharded=True)
    opt = None
    if opt_state is not None:
        opt = (opt_state if isinstance(opt_state, CanonicalOptState)
               else to_canonical_opt(opt_state, obj, impl))
    return Checkpoint(cfg, state, opt, None if step is None else int(step))


def save(obj: Any, path: str | os.PathLike, fmt: str, *, impl: str | None = None,
         config: Any = None, opt_state: Any = None, step: int | None = None,
         force: bool = False, progress: ProgressFn | None = None, cast: Any = None,
         shard_size: int | str | None = None) -> Path:
    """Save a native model (optionally with its optax state and step), a canonical state dict
    (with `config`) or a Checkpoint as `fmt` at `path`, validated and atomically."""
    ck = as_checkpoint(obj, impl=impl, config=config, opt_state=opt_state, step=step)
    if cast is not None:
        ck = ck.cast(cast)
    return write(ck, path, fmt, force=force, progress=progress, shard_size=shard_size)


def load(path: str | os.PathLike, impl: str | None = None, *, arch: str | None = None,
         config: Any = None, optimizer: Any = None, model_only: bool = False,
         progress: ProgressFn | None = None, weights: str | None = None,
         mesh: Any = None, strategy: str = "dp") -> Any:
    """Read a checkpoint of any format.

    - ``load(path)``: the `Checkpoint` (canonical arrays, config, optimizer state, step);
    - ``load(path, impl)``: the native model of `impl` (what ``zoo.create`` returns;
      ``impl="canonical"`` gives the state dict);
    - ``load(path, impl, optimizer=tx)``: ``(model, opt_state, step)``, `opt_state` in the
      structure of ``tx.init(zoo.interface(impl).split(model)[1])``.

    `weights` ("main" or "ema") chooses the live or EMA weights of a training checkpoint.
    `mesh` (a `jax.sharding.Mesh`) and `strategy` (`zoo.runtime.sharding`) place the model as
    ``zoo.create(..., mesh=, strategy=)`` does; an orbax checkpoint is restored straight onto
    the mesh, each device reading its shards (whatever mesh wrote it).
    """
    placement = None if mesh is None else Placement(mesh, strategy)
    ck = read(path, arch=arch, config=config, model_only=model_only, progress=progress,
              weights=weights, placement=placement)
    if impl is None:
        return ck
    model = ck.model(impl)
    if mesh is not None:
        model = sharding.shard(model, impl, mesh, strategy, config=ck.config)
    if optimizer is None:
        return model
    return model, ck.opt_state(impl, optimizer), ck.step


def convert_file(src: str | os.PathLike, dst: str | os.PathLike, to: str, *,
                 force: bool = False, arch: str | None = None, config: Any = None,
                 model_only: bool = False, progress: ProgressFn | None = None,
                 cast: Any = None, adapt: bool = False, seed: int = 0,
                 shard_size: int | str | None = None,
                 weights: str | None = None, layout: str | None = None) -> Checkpoint:
    """Convert the checkpoint at `src` (a path, or a source: ``hf-hub:ORG/REPO[@REVISION]``,
    ``local-dir:PATH``) into format `to` at `dst`; returns what was converted.
    With `adapt`, `arch` / `config` is the target model the weights are adapted to (`read`).

    The source is only read. Nothing is written unless the whole checkpoint validates, and
    `dst` appears complete or not at all (see `converters.checkpoints.destination`). `cast`
    converts every floating array to that dtype (e.g. float64 for a JAX format without x64);
    `weights` ("main" or "ema") chooses between live and EMA weights (see `read`).
    `shard_size` (bytes or ``"5GB"``) writes sharded safetensors: a folder with an index.
    `layout` writes the state in a foreign layout's names (`converters.adapters`; the torch
    format), e.g. "torchvision-convnext" for torchvision's `convnext_tiny`.

    Arrays are read lazily where the source format allows it (memory-mapped safetensors and
    torch files) and written tensor by tensor where the target does (safetensors, torch).
    """
    src = local(src)  # a source (hf-hub:..., local-dir:...) becomes its local folder
    check_pair(src, dst)
    for_writing(to, dst, shard_bytes(shard_size))  # refused before reading: an unknown
    # format, a DST named for another, shards of a format that has none
    ck = read(src, arch=arch, config=config, model_only=model_only, progress=progress,
              cast=cast, adapt=adapt, seed=seed, weights=weights)
    write(ck, dst, to, force=force, progress=progress, source=src, shard_size=shard_size,
          layout=layout)
    return ck


def save_canonical(path: str | os.PathLike, state: Mapping[str, Any], config: Config, *,
                   force: bool = False) -> Path:
    """Write a canonical state as safetensors (PyTorch names and layouts, metadata with the
    architecture, config JSON and format version)."""
    return write(Checkpoint(make_config(config), numpy_state(state)), path, "canonical",
                 force=force)


def load_canonical(path: str | os.PathLike, *, arch: str | None = None, config: Any = None
                   ) -> tuple[dict[str, np.ndarray], Config]:
    """(canonical state, config) of a checkpoint (canonical safetensors or any other format)."""
    ck = read(path, arch=arch, config=config, model_only=True)
    return ck.state, ck.config
