"""Convert models between Equinox, Linen, NNX and PyTorch through the canonical layout.

The canonical state is a flat ``{name: array}`` dict with PyTorch ``state_dict`` names and
layouts (``fc1.weight``, ``bn1.running_var``, ``bn1.num_batches_tracked``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from converters import rules
from converters.trees import TREES, Tree, torch_to_numpy
from zoo.configs import Config
from zoo.registry import IMPLS, make_config, skeleton

_STATISTICS = ("running_mean", "running_var")


class ConversionError(ValueError):
    """A state does not fit a model; the message lists every offending key."""


def _tree(impl: str) -> Tree:
    if impl not in TREES:
        raise ValueError(f"unknown implementation {impl!r}; available: {list(IMPLS)}")
    return TREES[impl]


def to_canonical(model: Any, impl: str) -> dict[str, Any]:
    """The canonical state of a native model (arrays keep their dtype; nothing is copied
    beyond the layout changes). For Equinox pass `(model, state)` when the model has state."""
    tree = _tree(impl)
    out: dict[str, Any] = {}
    for layer in tree.layers(model):
        native = tree.read(model, layer)
        for key, value in rules.to_canonical(tree.family, native, layer).items():
            out[f"{layer.name}.{key}"] = value
    return out


def canonical_layers(config: Config) -> list[rules.Layer]:
    """The parameterised layers of an architecture, found in its Equinox tree."""
    return TREES["eqx"].layers(skeleton(config, "eqx"))


def canonical_spec(config: Config, dtype: Any = "float32") -> dict[str, jax.ShapeDtypeStruct]:
    """Expected canonical keys with shapes and dtypes (floating arrays in `dtype`, counters int64).
    """
    model = skeleton(config, "eqx", dtype)
    zeros = lambda a: jnp.zeros(a.shape, a.dtype) if isinstance(a, jax.ShapeDtypeStruct) else a
    spec = jax.eval_shape(lambda: to_canonical(jax.tree.map(zeros, model), "eqx"))
    return {
        k: v if jnp.issubdtype(v.dtype, jnp.floating)
        else jax.ShapeDtypeStruct(v.shape, np.int64)
        for k, v in spec.items()
    }


def validate(state: Mapping[str, Any], config: Config, dtype: Any = None) -> np.dtype:
    """Check every key, shape and dtype of `state` against `config`; return the float dtype.

    Raises `ConversionError` listing every missing, unexpected, misshaped or mistyped key.
    """
    state = as_numpy_state(state)
    floats = [np.dtype(v.dtype) for k, v in state.items() if not k.endswith(_STATISTICS)
              and hasattr(v, "dtype") and jnp.issubdtype(np.dtype(v.dtype), jnp.floating)]
    if dtype is None:  # the most common floating dtype sets the expectation
        dtype = max(set(floats), key=floats.count) if floats else np.dtype("float32")
    dtype = np.dtype(dtype)
    spec = canonical_spec(config, dtype)
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
        allowed = {dtype, np.dtype("float32")} if k.endswith(_STATISTICS) else {dtype}
        if jnp.issubdtype(want.dtype, jnp.floating) and got_dtype not in allowed:
            problems.append(f"{k!r}: expected dtype {dtype}, found {got_dtype}")
        if jnp.issubdtype(want.dtype, jnp.integer) and not jnp.issubdtype(got_dtype, jnp.integer):
            problems.append(f"{k!r}: expected an integer counter, found dtype {got_dtype}")
    if problems:
        hint = (f"\n(most keys do not match: is this a {config.arch} checkpoint with this config?)"
                if len(problems) > len(spec) // 2 else "")
        raise ConversionError(
            f"state does not fit {config.arch} {config.to_json()}: "
            f"{len(problems)} problem(s):\n  - " + "\n  - ".join(sorted(problems)) + hint
        )
    return dtype


def from_canonical(state: Mapping[str, Any], config: Config | str, impl: str,
                   *, dtype: Any = None) -> Any:
    """Build a native model of `impl` holding the arrays of a canonical `state`.

    `config` is a config or an architecture name (default config). `state` is validated first
    and never modified. Returns what `zoo.create` returns for that library.
    """
    config = make_config(config)
    tree = _tree(impl)
    state = as_numpy_state(state)
    dtype = validate(state, config, dtype)
    model = skeleton(config, impl, dtype)
    layers = tree.layers(model)
    as_array = (lambda a: a) if impl == "torch" else jnp.asarray
    arrays = {}
    for layer in layers:
        prefix = layer.name + "."
        canon = {k[len(prefix):]: as_array(v) for k, v in state.items() if k.startswith(prefix)}
        arrays[layer.name] = rules.to_native(tree.family, canon, layer)
    return tree.write(model, arrays, layers)


def as_numpy_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict in which torch tensors became numpy arrays (dtype kept); others pass through."""
    if not isinstance(state, Mapping):
        raise ConversionError(f"a canonical state is a mapping name -> array, got {type(state)}")
    return {k: torch_to_numpy(v) if hasattr(v, "is_floating_point") else v
            for k, v in state.items()}


def convert(model: Any, src: str, dst: str) -> Any:
    """Convert a native `src` model into a native `dst` model (through the canonical state)."""
    config = _tree(src).config(model)
    return from_canonical(to_canonical(model, src), config, dst)


def config_of(model: Any, impl: str) -> Config:
    """The architecture config a native model was built from."""
    return _tree(impl).config(model)
