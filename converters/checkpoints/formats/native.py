"""What the formats of the JAX libraries (Equinox files, orbax directories) share: a native
model built from the canonical arrays, abstract restore targets, float64 refused without x64."""

from __future__ import annotations

from abc import abstractmethod
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from converters.checkpoints.checkpoint import Checkpoint
from converters.checkpoints.format import CheckpointFormat
from converters.checkpoints.io import CheckpointError, detached
from converters.core import from_canonical
from converters.optim import build, to_native_opt
from zoo.libraries import native_interface

Layout = Any  # an optimizer layout (see `converters.optim`)


class NativeFormat(CheckpointFormat):
    """A JAX library's own way of saving (`impl` names the library, as `name` does)."""

    keeps_batch_counts: ClassVar[bool] = False  # JAX BatchNorms keep no batch counter
    ordered_opt: ClassVar[bool] = False  # optimizer containers as ordered tuples (Equinox)

    @property
    def impl(self) -> str:
        return self.name

    def refuse(self, ck: Checkpoint) -> None:
        """Refuse a dtype the library would silently change (float64 without jax x64)."""
        if np.dtype(ck.dtype) == np.float64 and not jax.config.jax_enable_x64:
            raise CheckpointError(
                f"the checkpoint holds float64 arrays, which {self.name} (JAX without "
                "jax_enable_x64) would store as float32: pass --cast float32 (cast='float32') "
                "to convert them explicitly, or enable x64")

    def native(self, ck: Checkpoint) -> tuple[Any, Any]:
        """(native model, native optimizer state or None) of `ck`."""
        # mapped arrays are read one by one as the layer rules consume them, not kept resident
        model = from_canonical({k: detached(v) for k, v in ck.state.items()}, ck.config,
                               self.impl)
        opt = None
        if ck.optimizer is not None:
            opt = to_native_opt(ck.optimizer, ck.state, ck.config, self.impl,
                                ordered=self.ordered_opt)
        return model, opt

    @abstractmethod
    def save_tree(self, tree: Any, path: Path) -> None:
        """Store a native tree (``zoo.interface(impl).checkpoint_tree(model)``) at `path` the
        library's way, without metadata."""

    def save_plain(self, res_state: Any, model: Any, data: Path) -> None:
        self.save_tree(native_interface(self.impl).checkpoint_tree(model), data)

    def abstract_opt(self, layout: Layout, params: Any) -> Any:
        """The abstract optimizer state of `layout` for the abstract `params`."""
        return build(layout, lambda p, m: params if m["__leaf__"] == "params" else
                     jax.ShapeDtypeStruct(tuple(m["shape"]), jnp.dtype(m["dtype"])),
                     ordered=self.ordered_opt)


def with_dtype(tree: Any, dtype: Any) -> Any:
    """Every floating abstract leaf in `dtype`: the canonical layout holds one floating dtype
    (Linen, for one, keeps float32 batch statistics next to bfloat16 parameters)."""
    dtype = jnp.dtype(dtype)
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, dtype) if isinstance(x, jax.ShapeDtypeStruct)
        and jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def most_common(dtypes: list[np.dtype]) -> np.dtype:
    """The dtype most parameters have (float32 when there are none)."""
    return Counter(dtypes).most_common(1)[0][0] if dtypes else np.dtype("float32")
