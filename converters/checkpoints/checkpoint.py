"""What every checkpoint format reads into and writes from: `Checkpoint` (the canonical
layout) and `Detection` (what a path holds). See `converters.checkpoints` for the public API.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from converters import adapters
from converters.checkpoints.io import FORMAT_VERSION as FORMAT_VERSION  # re-exported
from converters.checkpoints.io import CheckpointError, UsageError
from converters.core import (
    ConversionError,
    as_numpy_state,
    canonical_spec,
    from_canonical,
    validate,
)
from converters.optim import CanonicalOptState, opt_state_like, to_native_opt, validate_opt
from zoo.configs import Config
from zoo.libraries import interface

OPT_PREFIX = "optimizer/"


@dataclass
class Detection:
    """What a path holds: `fmt` (one of FORMATS), why we think so, and our metadata if any."""

    fmt: str
    reason: str
    meta: dict[str, Any] | None = None
    variant: str = ""  # when several format classes share `fmt` (torch: "pt", "safetensors")
    note: str = ""  # e.g. a stale sidecar that was ignored


@dataclass
class Checkpoint:
    """A checkpoint in the canonical layout: everything every format can be written from.

    `state` is the canonical model state (numpy arrays, dtypes as stored; a streamed source's
    arrays are read when used, e.g. by `np.asarray`); `optimizer` the
    canonical optimizer state (see `converters.optim`) and `step` the training step, both None
    for a model-only checkpoint. `layout` names the adapter (`converters.adapters`) that
    renamed a foreign layout's keys on reading ("" when none was needed); `notes` say what was
    left out on reading, `adapted` what was changed for another config (`read(adapt=True)`);
    `write_layout` the one whose names a format that can (`writes_layouts`) stores the state in
    (`--layout`).
    """

    config: Config
    state: dict[str, np.ndarray]
    optimizer: CanonicalOptState | None = None
    step: int | None = None
    source: Detection | None = field(default=None, compare=False)
    layout: str = field(default="", compare=False)  # the foreign layout adapter read through
    notes: tuple[str, ...] = field(default=(), compare=False)  # left out on reading
    adapted: tuple[str, ...] = field(default=(), compare=False)  # changed for another config
    write_layout: str = field(default="", compare=False)  # the foreign layout to write in
    _validated: tuple[Any, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def training(self) -> bool:
        return self.optimizer is not None or self.step is not None

    @property
    def dtype(self) -> np.dtype:
        return self.validate()

    def validate(self) -> np.dtype:
        """Check every key, shape and dtype (model and optimizer); ConversionError otherwise."""
        stamp = self._stamp()
        if self._validated is not None and self._validated[0] == stamp:
            return self._validated[1]  # nothing that validation looks at has changed
        dtype = validate(self.state, self.config)
        mixed = sorted(k for k, v in self.state.items()
                       if jnp.issubdtype(v.dtype, jnp.floating) and v.dtype != dtype)
        if mixed:
            raise ConversionError(
                f"the checkpoint mixes floating dtypes: {dtype} parameters, but "
                + ", ".join(f"{k!r} is {self.state[k].dtype}" for k in mixed[:10])
                + f"; the canonical layout holds one floating dtype: pass --cast {dtype} "
                "(cast=...) to convert them")
        if self.optimizer is not None:
            validate_opt(self.optimizer, self.config, OPT_PREFIX)
        self._validated = (stamp, dtype)
        return dtype

    def _stamp(self) -> tuple[Any, ...]:
        arrays = dict(self.state)
        if self.optimizer is not None:
            arrays.update({OPT_PREFIX + k: v for k, v in self.optimizer.arrays.items()})
        opt_layout = None if self.optimizer is None else json.dumps(self.optimizer.layout)
        return (self.config, opt_layout, tuple(
            (k, type(v), tuple(np.shape(v)), str(getattr(v, "dtype", ""))) for k, v in
            arrays.items()))

    def cast(self, dtype: Any) -> Checkpoint:
        """A copy whose floating arrays (model and optimizer) are `dtype`; integers are kept."""
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)

        dtype = np.dtype(jnp.dtype(dtype))
        if not jnp.issubdtype(dtype, jnp.floating):
            raise UsageError(f"--cast {dtype}: not a floating dtype")
        stored = sorted({np.dtype(v.dtype).name for v in self.state.values()
                         if jnp.issubdtype(v.dtype, jnp.floating)} - {dtype.name})
        said = (f"floating arrays cast from {', '.join(stored)} to {dtype.name}",) if stored else ()
        conv = lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
        opt = self.optimizer
        if opt is not None:
            opt = CanonicalOptState(opt.layout, {k: conv(np.asarray(v))
                                                 for k, v in opt.arrays.items()})
        return dataclasses.replace(self, state={k: conv(v) for k, v in self.state.items()},
                                   optimizer=opt, notes=(*self.notes, *said), _validated=None)

    def model_only(self) -> Checkpoint:
        return dataclasses.replace(self, optimizer=None, step=None)

    def model(self, impl: str) -> Any:
        """The native model of `impl` ("canonical" gives the state dict itself)."""
        if impl == "canonical":
            return dict(self.state)
        return from_canonical(self.state, self.config, impl)

    def opt_state(self, impl: str, optimizer: Any = None, *, template: Any = None) -> Any:
        """The optimizer state for `impl`.

        With an optax `optimizer` (or a `template` state such as ``tx.init(params)``) the result
        has exactly the optimizer's structure, ready for ``optimizer.update``; without, it is
        built from plain lists and dicts (the structure orbax stores).
        """
        if self.optimizer is None:
            raise CheckpointError("this checkpoint holds no optimizer state")
        if optimizer is not None:
            params = interface(impl).split(self.model(impl))[1]
            template = jax.eval_shape(optimizer.init, params)
        if template is None:
            return to_native_opt(self.optimizer, self.state, self.config, impl)
        return opt_state_like(self.optimizer, self.state, self.config, impl, template)


def numpy_state(state: Mapping[str, Any], keep_sharded: bool = False
                ) -> dict[str, np.ndarray]:
    """A canonical state of numpy arrays (from torch tensors, JAX arrays, numpy); with
    `keep_sharded`, JAX arrays spread over several devices stay there (orbax writes their
    shards; other writers gather one array at a time)."""
    return {k: v if keep_sharded and spread(v) else np.asarray(v)
            for k, v in as_numpy_state(state).items()}


def spread(a: Any) -> bool:
    """Whether `a` is a JAX array held by several devices."""
    return isinstance(a, jax.Array) and len(a.sharding.device_set) > 1


@dataclass(frozen=True)
class Placement:
    """Devices to read a checkpoint onto: a `jax.sharding.Mesh` and a `zoo.runtime.sharding`
    strategy ("dp", "fsdp", "tp")."""

    mesh: Any
    strategy: str = "dp"


@functools.lru_cache(maxsize=64)
def _key_order(config: Config) -> dict[str, int]:
    return {k: i for i, k in enumerate(canonical_spec(config))}


def ordered_state(ck: Checkpoint) -> dict[str, np.ndarray]:
    """`ck.state` in the architecture's canonical key order (unknown keys last)."""
    order = _key_order(ck.config)
    return {k: ck.state[k] for k in sorted(ck.state, key=lambda k: order.get(k, 1 << 30))}


def stored_state(ck: Checkpoint) -> dict[str, np.ndarray]:
    """The state as a file stores it: `ordered_state`, or in the names (and exact array
    transforms) of the foreign layout `ck.write_layout`, in the canonical order."""
    state = ordered_state(ck)
    return adapters.get(ck.write_layout).from_zoo(state) if ck.write_layout else state
