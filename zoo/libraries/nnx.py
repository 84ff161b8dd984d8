"""Flax NNX: batched, channels-last, stateful `nnx.Module` objects."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.numpy as jnp

from canonical.walkers import NNXWalker
from zoo.configs import Config
from zoo.interface import NNXInterface
from zoo.libraries.library import Library

if TYPE_CHECKING:  # Flax is imported when an NNX model is built or handed in
    from flax import nnx


class NNXModel(Protocol):
    """An NNX model class: `cls(config, *, rngs, param_dtype)` with `rngs` an `nnx.Rngs` holding
    "params" and "dropout" streams, keeping `self.config`; `model.train()` / `model.eval()`
    switch dropout and BatchNorm."""

    config: Config

    def __init__(self, config: Config, *, rngs: nnx.Rngs, param_dtype: Any = None) -> None: ...


class NNXLibrary(Library):
    name = "nnx"
    channels_last = True
    pads_same = True  # nnx.Conv's default padding is "SAME"
    package = "flax"
    checkpoint_format = "nnx"
    abstract_skeleton = True
    walker = NNXWalker()
    interface = NNXInterface()
    lora = "zoo.lora.nnx"
    contract = NNXModel
    rng_argument = "rngs"
    dtype_argument = "param_dtype"

    def owns(self, obj: Any) -> bool:
        nnx = sys.modules.get("flax.nnx")  # no NNX object exists before Flax is imported
        return nnx is not None and isinstance(obj, nnx.Module)

    def native_init(self, cls: type, config: Config, key: jax.Array, dtype: Any) -> Any:
        from flax import nnx

        return cls(config, rngs=nnx.Rngs(params=key, dropout=key), param_dtype=jnp.dtype(dtype))

    def skeleton(self, cls: type, config: Config, dtype: Any) -> Any:
        from flax import nnx

        with _tracer_errors_untold():
            return nnx.eval_shape(
                lambda: self.native_init(cls, config, jax.random.key(0), dtype))

    def annotate_shardings(self, model: Any) -> Any:
        """Each Variable's partition as its `out_sharding` metadata, which
        `nnx.get_partition_spec(nnx.state(model))` reads (in place: `model` is the zoo's
        own sharded copy)."""
        from flax import nnx

        for _, var in nnx.iter_graph(model):
            value = var.get_value() if isinstance(var, nnx.Variable) else None
            spec = getattr(getattr(value, "sharding", None), "spec", None)
            if spec is not None:
                var.set_metadata(out_sharding=(*spec, *(None,) * (value.ndim - len(spec))))
        return model


@contextlib.contextmanager
def _tracer_errors_untold() -> Iterator[None]:
    """Tracer errors without JAX's account of where the value came from, while a skeleton
    is traced. Each `nnx.Rngs` draw reads `.sharding` of a tracer, an AttributeError that
    Flax expects and drops; JAX words it by walking the whole trace, which makes tracing a
    model quadratic in its size (most of a ViT-L skeleton's time). Nothing changes where
    the JAX version has no such method."""
    try:
        from jax._src.interpreters.partial_eval import DynamicJaxprTracer
        told = DynamicJaxprTracer.__dict__["_origin_msg"]
    except (ImportError, KeyError):
        yield
        return
    DynamicJaxprTracer._origin_msg = lambda self: ""
    try:
        yield
    finally:
        DynamicJaxprTracer._origin_msg = told


NNX = NNXLibrary()
