"""Orbax trees written and read one layer at a time, through the layer rules.

Writing: each leaf of the library's tree is a `Pending` array (`layer_plan`) that runs its
layer's rule when orbax writes it, in order, a few at a time (at most `WRITE_BYTES` being
written at once), so no native model and no second copy is ever held; arrays already on
devices (a sharded model) are converted at once and stay there, and orbax writes each
device's shards. Reading: `LayerReader` restores a few layers' arrays at a time (an orbax
partial restore; numpy on the host, or straight onto target shardings) and runs the rules
to canonical.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from canonical import KINDS, Layer
from canonical.state import split_by_layer
from converters.checkpoints.formats.layer_plan import Arrays, Pending, Plan
from converters.checkpoints.formats.orbax_io import settled

CHUNK_BYTES = 64 * 2**20  # the native bytes restored by one orbax call when reading
WRITE_BYTES = 64 * 2**20  # the native bytes being written at once (overlapping their I/O)


def nested(flat: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """{path: leaf} as nested dicts."""
    out: dict[str, Any] = {}
    for path, leaf in flat.items():
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = leaf
    return out


# --------------------------------------------------------------------------- writing
class InFlight:
    """Byte counts admitted in the order they ask, while at most `limit` bytes are held
    (any one alone, however large)."""

    def __init__(self, limit: int):
        self.limit, self.held, self.asked, self.admitted = limit, 0, 0, 0
        self.changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def holding(self, n: int) -> AsyncIterator[None]:
        turn, self.asked = self.asked, self.asked + 1
        async with self.changed:
            await self.changed.wait_for(lambda: turn == self.admitted and (
                not self.held or self.held + n <= self.limit))
            self.held, self.admitted = self.held + n, self.admitted + 1
            self.changed.notify_all()
        try:
            yield
        finally:
            async with self.changed:
                self.held -= n
                self.changed.notify_all()


def _streaming_handler() -> Any:
    from orbax.checkpoint import type_handlers

    class StreamingHandler(type_handlers.NumpyHandler):
        """Writes `Pending` arrays in order, each made just before it is written, with at
        most `WRITE_BYTES` of them being written at once; stored as orbax stores numpy
        arrays."""

        def __init__(self) -> None:
            super().__init__(deepcopy_host_arrays=False)
            self.room: InFlight | None = None

        async def _background_serialize(self, values: Any, infos: Any, args: Any = None) -> None:
            self.room = InFlight(WRITE_BYTES)
            await super()._background_serialize(values, infos, args)

        async def _open_and_write(self, value: Any, tspec: Any, ts_context: Any) -> None:
            assert self.room is not None
            async with self.room.holding(value.nbytes):
                await super()._open_and_write(value.take(), tspec, ts_context)

    return StreamingHandler()


def save_streamed(tree: Any, path: Path) -> None:
    """An orbax checkpoint directory of `tree`, whose `Pending` leaves are made as written."""
    import orbax.checkpoint as ocp
    from orbax.checkpoint import type_handlers as th

    registry = th.create_type_handler_registry(
        (int, th.ScalarHandler()), (float, th.ScalarHandler()), (np.number, th.ScalarHandler()),
        (np.ndarray, th.NumpyHandler()), (jax.Array, th.ArrayHandler()),
        (Pending, _streaming_handler()))
    handler = ocp.PyTreeCheckpointHandler(type_handler_registry=registry)
    with settled(path), ocp.Checkpointer(handler) as ckptr:
        ckptr.save(path.absolute(), args=ocp.args.PyTreeSave(tree))


# --------------------------------------------------------------------------- reading
class LayerReader:
    """The canonical arrays of a stored tree, restored a few layers at a time (in the plan's
    order, at most `CHUNK_BYTES` of native arrays per orbax call) and converted by the rules.
    Each array is kept only until it is handed out; asked for again, its layer is read afresh.
    `shardings` (layer -> name -> sharding) restores the arrays onto devices, not the host."""

    def __init__(self, path: Path, p: Plan, dtype: Any,
                 shardings: Mapping[str, Mapping[str, Any]] | None = None,
                 advance: Callable[[int], None] = lambda n: None):
        self.path, self.plan, self.dtype = path, p, np.dtype(dtype)
        self.shardings, self.advance = shardings, advance
        self.ready: dict[str, Arrays] = {}
        self.taken: set[tuple[str, str]] = set()
        self.index = {layer.name: i for i, layer in enumerate(p.layers)}

    def take(self, layer: str, key: str) -> Any:
        if (layer, key) in self.taken:
            return self._restore([self.plan.layers[self.index[layer]]])[layer][key]
        if layer not in self.ready:
            self.ready.update(self._restore(self._chunk(self.index[layer])))
        arrays = self.ready[layer]
        out = arrays.pop(key)
        self.taken.add((layer, key))
        if not arrays:
            del self.ready[layer]
        return out

    def _chunk(self, start: int) -> list[Layer]:
        out, total = [], 0
        for layer in self.plan.layers[start:]:
            size = sum(s.size * self.dtype.itemsize for s in self.plan.native[layer.name].values())
            if out and total + size > CHUNK_BYTES:
                break
            if layer.name not in self.ready:
                out.append(layer)
                total += size
        return out

    def _at(self, layer: Layer, name: str) -> tuple[str, ...]:
        return self.plan.paths[(layer.name, name)]

    def _restore(self, chunk: list[Layer]) -> dict[str, Arrays]:
        """The canonical arrays of the layers of `chunk`, from one orbax call."""
        import orbax.checkpoint as ocp

        items, args = {}, {}
        for layer in chunk:
            for name, spec in self.plan.native[layer.name].items():
                dtype = self.dtype if np.issubdtype(spec.dtype, np.floating) else spec.dtype
                items[self._at(layer, name)] = jax.ShapeDtypeStruct(spec.shape, dtype)
                args[self._at(layer, name)] = (
                    ocp.RestoreArgs(restore_type=np.ndarray, dtype=dtype)
                    if self.shardings is None else ocp.ArrayRestoreArgs(
                        sharding=self.shardings[layer.name][name], dtype=dtype,
                        global_shape=spec.shape))
        handler = ocp.PyTreeCheckpointHandler()
        with settled(self.path, "restore the orbax checkpoint"), ocp.Checkpointer(handler) as c:
            restored = c.restore(self.path.absolute(), args=ocp.args.PyTreeRestore(
                item=nested(items), restore_args=nested(args), partial_restore=True))
        out = {}
        for layer in chunk:
            native = {}
            for name in self.plan.native[layer.name]:
                node = restored
                for part in self._at(layer, name):
                    node = node[part]
                native[name] = node
            self.advance(sum(int(a.nbytes) for a in native.values()))
            arrays = KINDS[layer.kind].convert(self.plan.family, native, layer, to="canonical")
            out[layer.name] = {k: a if self.shardings is not None else np.asarray(a)
                               for k, a in arrays.items()}
        return out


class Restored(np.lib.mixins.NDArrayOperatorsMixin):
    """A canonical array read from an orbax checkpoint when it is used (`np.asarray`, NumPy's
    functions and operators, `a - b`; any other ndarray attribute, `sum` or `tobytes`, is that
    of the array read afresh)."""

    def __init__(self, reader: LayerReader, layer: str, key: str, spec: Any):
        self.reader, self.layer, self.key = reader, layer, key
        self.shape, self.dtype = tuple(spec.shape), np.dtype(spec.dtype)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not hasattr(np.ndarray, name) or name in (
                "reader", "layer", "key", "shape", "dtype"):
            raise AttributeError(name)  # not an array's (e.g. torch's `is_floating_point`)
        return getattr(np.asarray(self), name)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        del copy  # always a new array: the reader keeps nothing once it is handed out
        a = np.asarray(self.reader.take(self.layer, self.key))
        return a if dtype is None else a.astype(dtype)


def canonical_arrays(reader: LayerReader, spec: Mapping[str, Any], eager: bool
                     ) -> Iterator[tuple[str, Any]]:
    """(key, array) of every canonical key of `spec`, in its order: `Restored` arrays, or
    the arrays themselves (`eager`: e.g. restored onto devices)."""
    for layer, arrays in split_by_layer(spec, reader.plan.layers).items():
        for key, s in arrays.items():
            name = f"{layer}.{key}" if key else layer
            yield name, reader.take(layer, key) if eager else Restored(reader, layer, key, s)
