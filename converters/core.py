"""Convert zoo models between Equinox, Linen, NNX and PyTorch through the canonical layout.

The canonical state is a flat ``{name: array}`` dict with PyTorch ``state_dict`` names and
layouts (``fc1.weight``, ``bns.0.running_var``, ``bns.0.num_batches_tracked``, ...). The schema of a
conversion comes from the models themselves: `to_canonical` reads the model handed in,
`from_canonical` fills the skeleton of the target library, and the architecture's config (the
model's `.config`) contributes only the facts a tree does not show (an input to trace a Linen
module with, a flattened feature map).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import canonical
from canonical import KINDS, ConversionError, KeyMismatchError, Layer, StateMismatchError
from canonical.state import walker
from canonical.torch_arrays import torch_to_numpy
from zoo.configs import Config
from zoo.names import make_config
from zoo.registry import schema, skeleton, walk_facts

__all__ = ["ConversionError", "as_numpy_state", "canonical_layers", "canonical_spec",
           "config_of", "convert", "from_canonical", "to_canonical", "validate"]


def config_of(model: Any, impl: str) -> Config:
    """The zoo config a native model was built from (its `.config`; for Equinox `(model,
    state)` and Linen `(module, variables)` that of the first element)."""
    walker(impl)
    obj = model[0] if isinstance(model, tuple) else model
    config = getattr(obj, "config", None)
    if not isinstance(config, Config):
        raise ConversionError(
            f"{impl} model {type(obj).__name__} has no zoo config (a `.config` attribute "
            "holding a zoo.Config): build it with zoo.create, or convert it with "
            "canonical.read and the facts its architecture needs")
    return config


def to_canonical(model: Any, impl: str) -> dict[str, Any]:
    """The canonical state of a native zoo model: every parameter and statistic, or a
    ConversionError naming what no layer kind converts. Arrays keep their dtype. For Equinox
    pass `(model, state)` when the model has state."""
    config = config_of(model, impl)
    return canonical.read(model, impl, **walk_facts(config, impl))


def canonical_layers(config: Config, impl: str | None = None) -> list[Layer]:
    """The layers of an architecture, read from the skeleton of `impl`."""
    return schema(config, impl)[0]


def canonical_spec(config: Config, dtype: Any = "float32", impl: str | None = None
                   ) -> dict[str, jax.ShapeDtypeStruct]:
    """Expected canonical keys with shapes and dtypes (floating arrays in `dtype`, counters
    int64), read from the skeleton of `impl` (default: any implementation of the
    architecture: all have the same canonical keys)."""
    return {k: jax.ShapeDtypeStruct(v.shape, dtype if jnp.issubdtype(v.dtype, jnp.floating)
                                    else v.dtype)
            for k, v in schema(config, impl)[1].items()}


def buffer_keys(config: Config, impl: str | None = None) -> frozenset[str]:
    """Canonical keys of statistics (never trained): the layer kinds' `buffers`."""
    return frozenset(f"{layer.name}.{b}" for layer in canonical_layers(config, impl)
                     for b in KINDS[layer.kind].buffers)


def validate(state: Mapping[str, Any], config: Config, dtype: Any = None,
             impl: str | None = None) -> np.dtype:
    """Check every key, shape and dtype of `state` against `config` (as built in `impl`);
    return the float dtype.

    Raises `ConversionError` listing every missing, unexpected, misshaped or mistyped key.
    """
    state = as_numpy_state(state)
    buffers = buffer_keys(config, impl)
    floats = [np.dtype(v.dtype) for k, v in state.items() if k not in buffers
              and hasattr(v, "dtype") and jnp.issubdtype(np.dtype(v.dtype), jnp.floating)]
    if dtype is None:  # the most common floating dtype sets the expectation
        dtype = max(set(floats), key=floats.count) if floats else np.dtype("float32")
    dtype = np.dtype(dtype)
    spec = canonical_spec(config, dtype, impl)
    problems = [f"missing key {k!r} (expected shape {tuple(spec[k].shape)})"
                for k in spec if k not in state]
    problems += [f"unexpected key {k!r} (shape {tuple(np.shape(state[k]))})"
                 for k in state if k not in spec]
    for k in spec.keys() & state.keys():
        want, got = spec[k], state[k]
        if not hasattr(got, "shape") or not hasattr(got, "dtype"):
            problems.append(f"{k!r}: expected an array, found {type(got).__name__}")
            continue
        if tuple(got.shape) != tuple(want.shape):
            problems.append(f"{k!r}: expected shape {tuple(want.shape)}, found {tuple(got.shape)}")
        got_dtype = np.dtype(got.dtype)
        # Flax keeps BatchNorm statistics in float32 whatever the parameter dtype.
        allowed = {dtype, np.dtype("float32")} if k in buffers else {dtype}
        if jnp.issubdtype(want.dtype, jnp.floating) and got_dtype not in allowed:
            problems.append(f"{k!r}: expected dtype {dtype}, found {got_dtype}")
        if jnp.issubdtype(want.dtype, jnp.integer) and not jnp.issubdtype(got_dtype, jnp.integer):
            problems.append(f"{k!r}: expected an integer counter, found dtype {got_dtype}")
    if problems:
        hint = (f"\n(most keys do not match: is this a {config.arch} checkpoint with this config?)"
                if len(problems) > len(spec) // 2 else "")
        names_differ = spec.keys() != state.keys()
        raise (KeyMismatchError if names_differ else StateMismatchError)(
            f"state does not fit {config.arch} {config.to_json()}: "
            f"{len(problems)} problem(s):\n  - " + "\n  - ".join(sorted(problems)) + hint
        )
    return dtype


def from_canonical(state: Mapping[str, Any], config: Config | str, impl: str,
                   *, dtype: Any = None) -> Any:
    """Build a native model of `impl` holding the arrays of a canonical `state`.

    `config` is a config or an architecture name (default config). `state` is validated
    against the skeleton of `impl` first and never modified; a tied array's alias (`Config.ties`,
    transformers' `lm_head.weight` beside the embedding) is accepted when it equals its source.
    Returns what `zoo.create` returns for that library.
    """
    walker(impl)
    config = make_config(config)
    state = canonical.untie(as_numpy_state(state), config.ties)  # an alias beside its source
    dtype = validate(state, config, dtype, impl)
    return canonical.write(skeleton(config, impl, dtype), state, impl,
                           **walk_facts(config, impl))


def as_numpy_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict in which torch tensors became numpy arrays (dtype kept); others pass through."""
    if not isinstance(state, Mapping):
        raise ConversionError(f"a canonical state is a mapping name -> array, got {type(state)}")
    return {k: torch_to_numpy(v) if hasattr(v, "is_floating_point") else v
            for k, v in state.items()}


def convert(model: Any, src: str, dst: str) -> Any:
    """Convert a native `src` model into a native `dst` model (through the canonical state)."""
    return from_canonical(to_canonical(model, src), config_of(model, src), dst)
