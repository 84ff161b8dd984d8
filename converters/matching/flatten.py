"""The flatten-order trap: a linear layer fed by a flattened conv map sees `(C, *spatial)`
order in PyTorch and Equinox, `(*spatial, C)` in Flax. Where no zoo config gives the map's
shape, it is traced through the reshape that feeds the layer (one abstract eval-mode call of a
JAX model, `Interface.eval_fn`)
or guessed from the channels of the layer before; a wrong one fails the verification.
Only C and the spatial size matter to the permutation, not how the spatial axes split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from converters.matching.match import TargetLayer
from zoo.libraries import library, native_interface


def abstract_input_of(input_shape: tuple[int, ...], impl: str) -> jax.ShapeDtypeStruct:
    """One abstract sample, batched, in `impl`'s layout."""
    canonical = jax.ShapeDtypeStruct((1, *input_shape), np.float32)
    return jax.eval_shape(native_interface(impl).to_native, canonical)


def guess_flatten(targets: Sequence[TargetLayer]) -> tuple[int, ...] | None:
    """(C, *spatial) of the map before the first linear layer that follows a conv or norm: C
    from that layer, the spatial size square (cubic, ...) when it can be, else one axis. Only C
    and the spatial size matter to the permutation, not how the spatial axes split."""
    channels, rank = None, 1
    for t in targets:
        w = t.shapes.get("weight")
        if t.kind in ("conv", "conv_transpose") and w is not None:
            channels, rank = w[0] if t.kind == "conv" else w[1], len(w) - 2
        elif t.kind in ("batch_norm", "group_norm") and channels is not None:
            channels = next(iter(t.shapes.values()))[0]
        elif t.kind == "linear" and w is not None:
            if channels is None or w[1] % channels:
                return None
            n = w[1] // channels
            side = round(n ** (1 / rank))
            return (channels, *(side,) * rank) if side ** rank == n else (channels, n)
    return None


def _eqns(jaxpr: Any):
    """Every equation of a jaxpr, nested ones (jit, custom derivatives) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for p in eqn.params.values():
            for sub in p if isinstance(p, tuple | list) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


def trace_flatten(model: Any, impl: str, input_shape: tuple[int, ...],
                  fan_ins: Sequence[int]) -> tuple[int, ...] | None:
    """(C, *spatial) of the first reshape, in one traced call of a JAX model, that flattens a
    feature map into one of `fan_ins` values (None if there is none, or for PyTorch)."""
    api = native_interface(impl)
    try:  # PyTorch has no traceable function; a model needing more arguments cannot be traced
        fn, arrays = api.eval_fn(model)
        jaxpr = jax.make_jaxpr(fn)(arrays, abstract_input_of(input_shape, impl)).jaxpr
    except Exception:  # either way: guess instead
        return None
    for eqn in _eqns(jaxpr):
        if eqn.primitive.name != "reshape":
            continue
        shape_in, shape_out = eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
        if len(shape_out) == 2 and len(shape_in) >= 3 and shape_out[-1] in fan_ins:
            sample = shape_in[1:]  # batched (Equinox's per-sample call under `jax.vmap`)
            return (sample[-1], *sample[:-1]) if api.channels_last else tuple(sample)
    return None


def needs_flatten(*impls: str) -> bool:
    """Flax and the others order a flattened map differently; alike libraries do not."""
    return len({library(i).channels_last for i in impls}) > 1


def find_flatten(src: Any, src_impl: str, dst: Any, dst_impl: str,
                 targets: Sequence[TargetLayer], input_shape: tuple[int, ...] | None,
                 runnable: Callable[[Any], bool]) -> tuple[tuple[int, ...] | None, str]:
    """The flattened map's shape: traced through a model's reshape when the input shape is
    known, else guessed from the layer before the first linear one (verification checks it)."""
    if input_shape is not None:
        fan_ins = [t.shapes["weight"][1] for t in targets if t.kind == "linear"]
        for model, impl in ((src, src_impl), (dst, dst_impl)):
            if runnable(model):
                found = trace_flatten(model, impl, tuple(input_shape), fan_ins)
                if found is not None:
                    return found, f"{impl} model's reshape (traced)"
    guess = guess_flatten(targets)
    return guess, "guessed" if guess is not None else ""
