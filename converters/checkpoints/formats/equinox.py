"""Equinox files: `eqx.tree_serialise_leaves` of the model (or of (model, optimizer state,
step)), the architecture and config in a JSON sidecar."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import canonical
from canonical.paths import key_name
from converters.checkpoints.checkpoint import OPT_PREFIX, Checkpoint, Detection, numpy_state
from converters.checkpoints.configs import resolve_config
from converters.checkpoints.format import Entry, ForeignTree, Probe, checkpoint_bytes
from converters.checkpoints.formats.layer_plan import (
    Pending,
    canonical_state,
    native_leaves,
    plan,
)
from converters.checkpoints.formats.native import NativeFormat, most_common, with_dtype
from converters.checkpoints.io import (
    NPY_MAGIC,
    CheckpointError,
    NpyRecord,
    ProgressFn,
    ProgressTask,
    contiguous,
    first_line,
    load_npy,
    npy_records,
    scan_npy_stream,
    sidecar_path,
)
from converters.checkpoints.metadata import (
    read_sidecar,
    restore_num_batches_tracked,
    stored_dtype,
)
from converters.checkpoints.staging import HashingFile
from converters.core import ConversionError, to_canonical
from converters.optim import abstract_params, canonical_from_native
from zoo.configs import Config
from zoo.libraries import interface
from zoo.registry import skeleton, walk_facts


def _is_record(x: Any) -> bool:
    """Whether `eqx.tree_serialise_leaves` writes leaf `x` (as one `.npy` record)."""
    return _is_array(x) or eqx.is_array_like(x)


def _leaves(like: Any) -> list[tuple[str, Any]]:
    """(name, leaf) of every leaf that `eqx.tree_serialise_leaves` writes, in file order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(like)
    return [(jax.tree_util.keystr(p), x) for p, x in flat if _is_record(x)]


def _record_paths(like: Any) -> list[tuple[str, ...] | None]:
    """The tree path of every record holding an array, in file order (as `layer_plan.plan`
    names them); None for a record of a plain scalar field (a dropout's `p`)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(like)
    return [tuple(key_name(k) for k in p) if _is_array(x) else None
            for p, x in flat if _is_record(x)]


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct | jax.Array | np.ndarray)


def _mapped(path: Path, r: NpyRecord) -> np.ndarray:
    """A copy-on-write memory map of one record's data (nothing is read until used; a writer
    reads it afresh, `io.detached`)."""
    if math.prod(r.shape) == 0 or not r.shape:  # nothing, or a scalar: read it
        return np.fromfile(path, r.dtype, count=math.prod(r.shape), offset=r.offset
                           ).reshape(r.shape)
    return np.memmap(path, r.dtype, mode="c", offset=r.offset, shape=r.shape)


def _problems(headers: list, leaves: list[tuple[str, Any]]) -> list[str]:
    problems = []
    if len(headers) != len(leaves):
        problems.append(f"the file holds {len(headers)} arrays, the model expects {len(leaves)}")
    for i, ((name, like), (shape, dtype)) in enumerate(zip(leaves, headers, strict=False)):
        if _is_array(like):
            want = (tuple(like.shape), np.dtype(like.dtype))
            if want != (shape, np.dtype(dtype)):
                problems.append(f"array #{i} {name}: expected shape {want[0]} {want[1]}, found "
                                f"{shape} {dtype}")
        elif shape != ():
            problems.append(f"array #{i} {name}: expected a scalar, found shape {shape}")
    return problems


class EquinoxLeaves(NativeFormat):
    """``eqx``: one ``.npy`` record per array leaf, in the model's tree order."""

    name: ClassVar[str] = "eqx"
    suffixes: ClassVar[tuple[str, ...]] = (".eqx",)
    sidecar: ClassVar[bool] = True
    ordered_opt: ClassVar[bool] = True
    names_keys: ClassVar[bool] = False

    def read_tree(self, path: Path, weights: str | None = None) -> ForeignTree:
        raise CheckpointError(f"{path}: an Equinox leaf file stores no names, so its layers "
                              "cannot be matched: load it into its own model and use "
                              "converters.transfer")

    def detect(self, probe: Probe) -> Detection | None:
        if not probe.head.startswith(NPY_MAGIC):
            return None
        meta, note = read_sidecar(probe.path, probe.size)
        why = "starts with the .npy magic: an Equinox tree_serialise_leaves file"
        return self.detection(
            why + (f", sidecar {sidecar_path(probe.path).name}" if meta else ""), meta, note)

    def rejection(self, probe: Probe) -> str:
        return "not an Equinox .npy stream"

    def damaged(self, probe: Probe) -> str:
        return f"{probe.path}: not an Equinox leaf file (no .npy magic): corrupted"

    def _like(self, config: Config, dtype: Any, meta: dict[str, Any] | None) -> Any:
        """The abstract tree the file serialises (model, or (model, optimizer state, step))."""
        model = with_dtype(skeleton(config, self.impl, dtype), dtype)
        if not meta or meta.get("kind") != "training":
            return model
        layout, step = meta.get("optimizer"), meta.get("step")
        opt = None if layout is None else self.abstract_opt(layout,
                                                            abstract_params(model, self.impl))
        return (model, opt, None if step is None else 0)

    def read(self, path: Path, det: Detection, given: Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        config = resolve_config(path, det.meta, given)
        with open(path, "rb") as f:
            records = npy_records(f, path.stat().st_size, str(path))
        headers = [(r.shape, r.dtype) for r in records]
        like = self._like(config, self._dtype(config, det.meta, headers), det.meta)
        problems = _problems(headers, _leaves(like))
        if problems:
            hint = ("\n(is this an Equinox checkpoint of this architecture and config?)"
                    if len(headers) != len(_leaves(like)) else "")
            raise ConversionError(f"{path} does not fit {config.arch} {config.to_json()}: "
                                  f"{len(problems)} problem(s):\n  - "
                                  + "\n  - ".join(problems[:50]) + hint)
        total = sum(int(np.prod(shape)) * np.dtype(d).itemsize for shape, d in headers)
        task = ProgressTask(progress, "reading", total)
        state = self._streamed(path, config, like, records)
        if state is not None:
            task.advance(total)
            restore_num_batches_tracked(state, det.meta)
            return Checkpoint(config, state)
        out = _deserialise(path, like, task)
        training = bool(det.meta and det.meta.get("kind") == "training")
        model, opt_tree, step = out if training else (out, None, None)
        state = numpy_state(to_canonical(model, self.impl))
        restore_num_batches_tracked(state, det.meta)
        opt = None
        if opt_tree is not None:
            opt = canonical_from_native(det.meta["optimizer"], opt_tree, model, self.impl,
                                        ordered=True)
        return Checkpoint(config, state, opt, None if step is None else int(step))

    def _streamed(self, path: Path, config: Config, like: Any, records: list[NpyRecord]
                  ) -> dict[str, Any] | None:
        """A model without state read record by record: each record a memory map, each
        layer through its rule (`layer_plan`: no native model is built, the file is not
        copied). None for a training file, a stateful model (an `eqx.nn.State`) or records
        unlike what the model would hold (Fortran order, a dtype JAX does not keep), which
        are read into the native model instead."""
        if isinstance(like, tuple):
            return None
        arrays = {k: r for k, r in zip(_record_paths(like), records, strict=True)
                  if k is not None}
        if any(r.fortran or jax.dtypes.canonicalize_dtype(r.dtype) != r.dtype
               for r in arrays.values()):
            return None
        p = plan(interface(self.impl).clone(like), self.impl,
                 walk_facts(config, self.impl), lambda m: m)
        if arrays.keys() != set(p.paths.values()):
            return None
        return canonical_state(p, {k: _mapped(path, r) for k, r in arrays.items()})

    def _dtype(self, config: Config, meta: dict[str, Any] | None,
               headers: list[tuple[tuple[int, ...], np.dtype]]) -> np.dtype:
        """The recorded dtype; without a sidecar, the most common floating dtype at the
        floating-parameter positions."""
        dtype = stored_dtype(meta)
        if dtype is not None:
            return dtype
        leaves = _leaves(self._like(config, "float32", meta))
        return most_common([
            np.dtype(d) for (_, like), (_, d) in zip(leaves, headers, strict=False)
            if isinstance(like, jax.ShapeDtypeStruct) and jnp.issubdtype(like.dtype, jnp.floating)
            and jnp.issubdtype(np.dtype(d), jnp.floating)])

    def write(self, ck: Checkpoint, data: Path) -> None:
        self.write_counted(ck, data, lambda n: None)

    def write_counted(self, ck: Checkpoint, data: Path, advance: Callable[[int], None]) -> None:
        with open(data, "wb") as f:
            self._save(ck, f, advance)

    def write_hashed(self, ck: Checkpoint, data: Path, advance: Callable[[int], None]
                     ) -> dict[str, Any]:
        """Hashed as written: Equinox writes its records front to back."""
        with HashingFile(data) as f:
            self._save(ck, f, advance)
        return f.digest()

    def _save(self, ck: Checkpoint, f: BinaryIO | HashingFile,
              advance: Callable[[int], None]) -> None:
        """A model without state streamed record by record: each native array is made by
        its layer's rule as it is written (`layer_plan`: no native model is built). A
        stateful model (an `eqx.nn.State` holds JAX arrays) and a training checkpoint (its
        optimizer state is laid out on the model) are built."""
        dtype = ck.validate()
        skel = None if ck.training else with_dtype(skeleton(ck.config, self.impl, dtype), dtype)
        if skel is None or isinstance(skel, tuple):
            model, opt = self.native(ck)
            eqx.tree_serialise_leaves(f, (model, opt, ck.step) if ck.training else model,
                                      filter_spec=_serialise)
            advance(checkpoint_bytes(ck))
            return
        p = plan(interface(self.impl).clone(skel), self.impl, walk_facts(ck.config, self.impl),
                 lambda m: m)
        tree = canonical.walker(self.impl).write(skel, native_leaves(p, ck.state, advance),
                                                 p.layers)
        eqx.tree_serialise_leaves(f, tree, filter_spec=_serialise)

    def save_tree(self, tree: Any, path: Path) -> None:
        save_eqx_tree(tree, path)

    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        """The canonical keys when the file loads (its own leaves have no names), else every
        record by position."""
        if ck is not None:
            arrays = dict(ck.state)
            if ck.optimizer is not None:
                arrays.update({OPT_PREFIX + k: v for k, v in ck.optimizer.arrays.items()})
            return [(k, tuple(np.shape(v)), np.dtype(v.dtype).name) for k, v in arrays.items()]
        with open(path, "rb") as f:
            headers = scan_npy_stream(f, path.stat().st_size, str(path))
        return [(f"#{i}", s, np.dtype(d).name) for i, (s, d) in enumerate(headers)]


def _deserialise(path: Path, like: Any, task: ProgressTask) -> Any:
    """The tree `like` filled from the file, record by record, never unpickling."""
    def spec(f: Any, x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct | jax.Array):
            a = jnp.asarray(load_npy(f))
        elif isinstance(x, np.ndarray):
            a = load_npy(f)
        elif eqx.is_array_like(x):
            a = type(x)(load_npy(f).item())
        else:
            return x
        task.advance(np.asarray(a).nbytes)
        return a

    try:
        with open(path, "rb") as f:
            return eqx.tree_deserialise_leaves(f, like, filter_spec=spec)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the Equinox file ({first_line(e)}): "
                              "truncated or corrupted") from e


def _serialise(f: Any, x: Any) -> None:
    """Equinox's record of a leaf; a `Pending` array made (C order, as JAX holds it) first."""
    if isinstance(x, Pending):
        np.save(f, contiguous(x.take()), allow_pickle=False)
    else:
        eqx.default_serialise_filter_spec(f, x)


def save_eqx_tree(tree: Any, path: Path) -> None:
    """`eqx.tree_serialise_leaves` of `tree` into `path`, whatever its suffix."""
    with open(path, "wb") as f:  # a handle: given a path, Equinox would force a .eqx suffix
        eqx.tree_serialise_leaves(f, tree, filter_spec=_serialise)
