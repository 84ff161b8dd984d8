"""Orbax checkpoint directories of Flax Linen variables or NNX states (plus ``zoo.json``)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import canonical
from converters.checkpoints.checkpoint import Checkpoint, Detection, Placement, numpy_state
from converters.checkpoints.configs import resolve_config
from converters.checkpoints.format import (
    Entry,
    ForeignTree,
    Probe,
    checkpoint_bytes,
    registered,
)
from converters.checkpoints.formats.layer_plan import Plan, native_leaves, plan
from converters.checkpoints.formats.native import NativeFormat, most_common, with_dtype
from converters.checkpoints.formats.orbax_io import restore, save_orbax_tree, stored_tree
from converters.checkpoints.formats.orbax_layers import (
    LayerReader,
    canonical_arrays,
    save_streamed,
)
from converters.checkpoints.io import (
    DIR_METADATA,
    ProgressFn,
    ProgressTask,
    file_size,
    read_json_meta,
)
from converters.checkpoints.metadata import (
    check_meta,
    restore_num_batches_tracked,
    stored_dtype,
    write_json,
)
from converters.checkpoints.unwrap import unwrap_variables
from converters.core import (
    KeyMismatchError,
    StateMismatchError,
    canonical_spec,
    to_canonical,
)
from converters.optim import abstract_params, canonical_from_native
from zoo.configs import Config
from zoo.libraries import interface
from zoo.registry import skeleton, walk_facts
from zoo.runtime import sharding

MARKERS = ("_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt", "checkpoint")
TRAINING_KEYS = ("opt_state", "step")


def _dir_meta(path: Path) -> dict[str, Any] | None:
    meta = read_json_meta(path / DIR_METADATA)
    return None if meta is None else check_meta(meta, path / DIR_METADATA)


def _flat_abstract(tree: Any) -> dict[str, Any]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    name = lambda p: ".".join(str(getattr(k, a)) for k in p for a in ("name", "key", "idx")
                              if hasattr(k, a))
    return {name(p): x for p, x in flat}


def _problems(stored: dict[str, Any], target: dict[str, Any]) -> list[str]:
    problems = [f"missing key {k!r} (expected shape {tuple(np.shape(v))})"
                for k, v in target.items() if k not in stored]
    problems += [f"unexpected key {k!r} (shape {tuple(getattr(v, 'shape', ()) or ())})"
                 for k, v in stored.items() if k not in target]
    for k in stored.keys() & target.keys():
        got, want = stored[k], target[k]
        if not isinstance(want, jax.ShapeDtypeStruct):
            continue  # a Python scalar such as the step
        gshape = tuple(getattr(got, "shape", ()) or ())
        gdtype = getattr(got, "dtype", None)
        if gshape != tuple(want.shape):
            problems.append(f"{k!r}: expected shape {tuple(want.shape)}, found {gshape}")
        elif gdtype is not None and np.dtype(gdtype) != np.dtype(want.dtype):
            problems.append(f"{k!r}: expected dtype {np.dtype(want.dtype)}, found {gdtype}")
    return sorted(problems)


def _floating_dtypes(stored: dict[str, Any], target: dict[str, Any]) -> list[np.dtype]:
    """The stored dtypes at the target's floating positions."""
    return [np.dtype(stored[k].dtype) for k, v in target.items()
            if k in stored and isinstance(v, jax.ShapeDtypeStruct)
            and jnp.issubdtype(v.dtype, jnp.floating) and getattr(stored[k], "dtype", None)
            is not None and jnp.issubdtype(np.dtype(stored[k].dtype), jnp.floating)]


class Orbax(NativeFormat):
    """An orbax ``StandardCheckpointer`` directory of a library's model tree; a training
    checkpoint adds ``opt_state`` and ``step`` beside it."""

    directory: ClassVar[bool] = True
    label: ClassVar[str]  # the library as a reader calls it

    @abstractmethod
    def claims(self, names: list[str]) -> str | None:
        """Why a directory without our metadata, storing `names`, is this library's (or None)."""

    @abstractmethod
    def model_target(self, skel: Any, pure: bool) -> Any:
        """The abstract model tree the directory stores."""

    @abstractmethod
    def training_target(self, model_target: Any) -> dict[str, Any]:
        """The training tree around `model_target` (``opt_state`` and ``step`` added later)."""

    @abstractmethod
    def model_from(self, skel: Any, restored: Any, training: bool, pure: bool) -> Any:
        """The native model from the restored tree."""

    @abstractmethod
    def model_tree(self, model: Any, training: bool) -> Any:
        """The tree that stores `model` (a dict when `training`: entries are added to it)."""

    def pure(self, stored: dict[str, Any]) -> bool:
        """Whether the tree was saved as plain dicts (`nnx.to_pure_dict`), not Variables."""
        return False

    def detect(self, probe: Probe) -> Detection | None:
        path = probe.path
        meta = probe.fact("zoo.json", _dir_meta)
        if not any((path / m).exists() for m in MARKERS):
            return None
        said = (meta or {}).get("format")
        if said == self.name:
            return self.detection(f"orbax checkpoint directory with {DIR_METADATA} saying "
                                  f"format {said!r}", meta)
        if any(said == f.name for f in registered() if f.directory):
            return None  # another directory format's
        why = self.claims(list(probe.fact("orbax tree", stored_tree)))
        return None if why is None else self.detection(why, meta)

    def rejection(self, probe: Probe) -> str:
        path = probe.path
        if not path.is_dir():
            return "not an orbax directory"
        inner = sorted(str(p.parent.relative_to(path)) for m in MARKERS
                       for p in path.glob(f"*/{m}"))
        hint = (f"; it contains checkpoints, e.g. {path / inner[0]}: pass one of them"
                if inner else "")
        return (f"{path} is a directory but not an orbax checkpoint (none of "
                f"{', '.join(MARKERS)} in it){hint}")

    def target(self, config: Config, dtype: Any, meta: dict[str, Any] | None,
               pure: bool = False) -> tuple[Any, Any]:
        """(skeleton, abstract restore target) of a checkpoint we would write."""
        skel = with_dtype(skeleton(config, self.impl, dtype), dtype)
        model_target = self.model_target(skel, pure)
        if not meta or meta.get("kind") != "training":
            return skel, model_target
        layout, step = meta.get("optimizer"), meta.get("step")
        target = self.training_target(model_target)
        if layout is not None:
            target["opt_state"] = self.abstract_opt(layout, abstract_params(skel, self.impl))
        if step is not None:
            target["step"] = 0
        return skel, target

    def read(self, path: Path, det: Detection, given: Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        return self._read(path, det, given, progress, None, None)

    def read_weights(self, path: Path, det: Detection, given: Config | None,
                     progress: ProgressFn | None, weights: str | None) -> Checkpoint:
        return self._read(path, det, given, progress, weights, None)

    def read_placed(self, path: Path, det: Detection, given: Config | None,
                    progress: ProgressFn | None, placement: Placement | None) -> Checkpoint:
        return self._read(path, det, given, progress, None, placement)

    def _read(self, path: Path, det: Detection, given: Config | None,
              progress: ProgressFn | None, weights: str | None,
              placement: Placement | None) -> Checkpoint:
        """A model checkpoint is read a few layers at a time (`orbax_layers.LayerReader`):
        lazily to the host, or with `placement` straight onto the mesh, each array restored
        onto the sharding the strategy gives it in this library. A training checkpoint is
        restored whole (its optimizer state is read through the native model); a foreign
        training tree gives its live or EMA `weights`."""
        meta = det.meta
        config = resolve_config(path, meta, given)
        stored = stored_tree(path)
        if meta is None and self._around_variables(config, stored):
            return self._from_training_tree(path, config, weights)
        self.one_set(path, weights)
        pure = self.pure(stored)
        dtype = stored_dtype(meta)
        if dtype is None:
            dtype = most_common(_floating_dtypes(
                stored, _flat_abstract(self.target(config, "float32", meta, pure)[1])))
        skel, target = self.target(config, dtype, meta, pure)
        self._check(path, config, stored, _flat_abstract(target))
        training = bool(meta and meta.get("kind") == "training")
        if not training:
            task = ProgressTask(progress, "reading", file_size(path))
            where = None if placement is None else sharding.shardings(
                skel, self.impl, placement.mesh, placement.strategy, config=config)
            reader = LayerReader(path, self.plan(skel, config, pure), dtype, shardings=where,
                                 advance=task.advance)
            state = dict(canonical_arrays(reader, canonical_spec(config, dtype),
                                          eager=where is not None))
            restore_num_batches_tracked(state, meta)
            return Checkpoint(config, state)
        size = file_size(path)
        task = ProgressTask(progress, "reading", size)
        restored = restore(path, target)
        task.advance(size)
        model = self.model_from(skel, restored, training, pure)
        state = numpy_state(to_canonical(model, self.impl))
        restore_num_batches_tracked(state, meta)
        opt = step = None
        if training:
            if meta.get("optimizer") is not None:
                opt = canonical_from_native(meta["optimizer"], restored["opt_state"], model,
                                            self.impl, ordered=False)
            step = int(restored["step"]) if "step" in restored else None
        return Checkpoint(config, state, opt, step)

    def _around_variables(self, config: Config, stored: dict[str, Any]) -> bool:
        """A tree not written by the zoo holding more than the model's top-level entries
        beside a ``params`` collection (a Flax `TrainState`: ``opt_state``, ``step``)."""
        tops = {k.split(".")[0] for k in stored}
        return "params" in tops and bool(tops - set(self.target(config, "float32", None)[1]))

    def _from_training_tree(self, path: Path, config: Config,
                            weights: str | None) -> Checkpoint:
        """The model of a training tree's variables (live or EMA `weights`); the rest is left
        out (`Checkpoint.notes` says what)."""
        found = unwrap_variables(restore(path), str(path), weights)
        stored = _flat_abstract(found.state)
        skel, target = self.target(config, "float32", None)
        dtype = most_common(_floating_dtypes(stored, _flat_abstract(target)))
        skel, target = self.target(config, dtype, None)
        self._check(path, config, stored, _flat_abstract(target))
        model = self.model_from(skel, found.state, False, False)
        state = numpy_state(to_canonical(model, self.impl))
        return Checkpoint(config, state, notes=(found.note,) if found.note else ())

    def _check(self, path: Path, config: Config, stored: dict[str, Any],
               target: dict[str, Any]) -> None:
        problems = _problems(stored, target)
        if not problems:
            return
        missing = sum(p.startswith("missing") for p in problems)
        hint = (f"\n(most keys do not match: is this a {self.label} {config.arch} checkpoint "
                "with this config?)" if missing > len(target) // 2 else "")
        names_differ = any(p.startswith(("missing", "unexpected")) for p in problems)
        raise (KeyMismatchError if names_differ else StateMismatchError)(
            f"{path} does not fit {config.arch} {config.to_json()}: "
            f"{len(problems)} problem(s):\n  - " + "\n  - ".join(problems[:50]) + hint)

    def plan(self, skel: Any, config: Config, pure: bool = False) -> Plan:
        """Where each native array of the skeleton `skel` of `config` sits in the stored model
        tree (`skel` is left as it was)."""
        return plan(interface(self.impl).clone(skel), self.impl, walk_facts(config, self.impl),
                    lambda m: self.model_target(m, pure))

    def write_counted(self, ck: Checkpoint, data: Path, advance: Callable[[int], None]) -> None:
        """A model checkpoint streamed layer by layer (`orbax_layers`, `layer_plan`): each
        native array is made by its layer's rule as orbax writes it. A training checkpoint
        builds the native model (its optimizer state is laid out on it)."""
        if ck.training:
            self.write(ck, data)
            advance(checkpoint_bytes(ck))
            return
        dtype = ck.validate()
        skel = self.target(ck.config, dtype, None)[0]
        p = self.plan(skel, ck.config)
        model = canonical.walker(self.impl).write(skel, native_leaves(p, ck.state, advance),
                                                  p.layers)
        save_streamed(self.model_tree(model, False), data)
        write_json(data / DIR_METADATA, self.metadata(ck))

    def write(self, ck: Checkpoint, data: Path) -> None:
        if not ck.training:
            return self.write_counted(ck, data, lambda n: None)
        model, opt = self.native(ck)
        tree = self.model_tree(model, ck.training)
        if ck.training:
            if opt is not None:
                tree["opt_state"] = opt
            if ck.step is not None:
                tree["step"] = int(ck.step)
        save_orbax_tree(tree, data)
        write_json(data / DIR_METADATA, self.metadata(ck))

    def read_tree(self, path: Path, weights: str | None = None) -> ForeignTree:
        found = unwrap_variables(restore(path), str(path), weights)  # without a target
        return ForeignTree(found.state, self.impl, False, found.note)

    def save_tree(self, tree: Any, path: Path) -> None:
        save_orbax_tree(tree, path)

    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        return [(k, tuple(getattr(v, "shape", ()) or ()),
                 np.dtype(v.dtype).name if getattr(v, "dtype", None) is not None else "scalar")
                for k, v in stored_tree(path).items()]


class LinenOrbax(Orbax):
    """``linen``: the variables ``{"params", "batch_stats"}`` (a training checkpoint adds
    ``opt_state`` and ``step`` at the top, as a Flax ``TrainState`` has them)."""

    name: ClassVar[str] = "linen"
    label: ClassVar[str] = "Linen"

    def claims(self, names: list[str]) -> str | None:
        if "params" in {n.split(".")[0] for n in names}:
            return ("orbax checkpoint directory with a top-level 'params' collection: Linen "
                    "variables")
        return None

    def model_target(self, skel: Any, pure: bool) -> Any:
        return dict(skel[1])

    def training_target(self, model_target: Any) -> dict[str, Any]:
        return dict(model_target)

    def model_from(self, skel: Any, restored: Any, training: bool, pure: bool) -> Any:
        return skel[0], {k: v for k, v in restored.items() if k not in TRAINING_KEYS}

    def model_tree(self, model: Any, training: bool) -> Any:
        return dict(model[1])


class NnxOrbax(Orbax):
    """``nnx``: ``nnx.state(model)`` (also read as `nnx.to_pure_dict`); a training checkpoint
    is ``{"model": state, "opt_state": ..., "step": ...}``. Any orbax tree without Linen's
    ``params`` is taken for one."""

    name: ClassVar[str] = "nnx"
    label: ClassVar[str] = "NNX"

    def claims(self, names: list[str]) -> str | None:
        if any(n.endswith(".value") for n in names):
            return ("orbax checkpoint directory whose leaves are NNX Variable '.value' entries: "
                    "an nnx.state")
        top = sorted({n.split(".")[0] for n in names})
        return (f"orbax checkpoint directory without a 'params' collection (top-level keys "
                f"{top[:6]}): taken as an NNX state")

    def pure(self, stored: dict[str, Any]) -> bool:
        return not any(k.endswith(".value") for k in stored)

    def model_target(self, skel: Any, pure: bool) -> Any:
        from flax import nnx

        state = nnx.split(skel)[1]
        return nnx.to_pure_dict(state) if pure else state

    def training_target(self, model_target: Any) -> dict[str, Any]:
        return {"model": model_target}

    def model_from(self, skel: Any, restored: Any, training: bool, pure: bool) -> Any:
        from flax import nnx

        part = restored["model"] if training else restored
        graphdef, abstract_state = nnx.split(skel)
        if pure:
            nnx.replace_by_pure_dict(abstract_state, part)
            part = abstract_state
        return nnx.merge(graphdef, part)

    def model_tree(self, model: Any, training: bool) -> Any:
        from flax import nnx

        state = nnx.state(model)
        return {"model": state} if training else state
