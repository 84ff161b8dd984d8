"""Run any native model (zoo-built or not) in eval mode on a canonical input, and compare two."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import jax
import numpy as np

from canonical.errors import ConversionError
from zoo import precision
from zoo.registry import CHANNELS_LAST


def _to_native(x: np.ndarray, impl: str) -> np.ndarray:
    return x.transpose(0, *range(2, x.ndim), 1) if impl in CHANNELS_LAST and x.ndim > 2 else x


def _to_canonical(y: Any, impl: str) -> np.ndarray:
    y = np.asarray(y[0] if isinstance(y, tuple) else y, np.float64)
    return y.transpose(0, y.ndim - 1, *range(1, y.ndim - 1)) if (
        impl in CHANNELS_LAST and y.ndim > 2) else y


def forward(model: Any, impl: str, x: np.ndarray) -> np.ndarray:
    """The eval-mode output of `model` on the batch `x` (canonical layout `(N, C, *spatial)`),
    in the canonical layout. The caller's model is not changed (eval mode is set on a copy)."""
    x = _to_native(np.asarray(x, np.float32), impl)
    with precision.exact():
        if impl == "torch":
            import torch

            m = copy.deepcopy(model).eval()
            with torch.no_grad():
                return _to_canonical(m(torch.from_numpy(x)).numpy(), impl)
        return _to_canonical(_jax_forward(model, impl, x), impl)


def _jax_forward(model: Any, impl: str, x: np.ndarray) -> Any:
    """One compiled call (eager Flax and Equinox code would compile every operation)."""
    if impl == "eqx":
        import equinox as eqx

        m, state = model if isinstance(model, tuple) else (model, None)
        params, static = eqx.partition(eqx.nn.inference_mode(m), eqx.is_array)

        def run(p: Any, s: Any, xs: Any) -> Any:
            net = eqx.combine(p, static)
            if s is None:
                return jax.vmap(net)(xs)
            return jax.vmap(lambda xi: net(xi, s)[0], axis_name="batch")(xs)

        return jax.jit(run)(params, state, x)
    if impl == "linen":
        module, variables = model
        kwargs = {"train": False} if "train" in inspect.signature(
            type(module).__call__).parameters else {}
        return jax.jit(lambda v, xs: module.apply(v, xs, **kwargs))(variables, x)
    from flax import nnx

    graphdef, state = nnx.split(model)

    def call(s: Any, xs: Any) -> Any:
        m = nnx.merge(graphdef, s)  # a copy: eval() does not reach the caller's model
        m.eval()
        return m(xs)

    return jax.jit(call)(state, x)


def max_difference(reference: np.ndarray, other: np.ndarray) -> float:
    """max |a - b| / max |reference| (the precision policy's `max_relative` comparison)."""
    if reference.shape != other.shape:
        raise ConversionError(f"verification: the outputs differ in shape: {reference.shape} "
                              f"and {other.shape}")
    scale = max(float(np.abs(reference).max()), 1e-30)
    return float(np.abs(reference - other).max()) / scale


def tolerance() -> float:
    return precision.tolerance("float32", kind="max_relative")


def random_input(input_shape: tuple[int, ...], batch: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, *input_shape)).astype(np.float32)
