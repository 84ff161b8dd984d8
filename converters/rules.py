"""One conversion rule per layer type, between the canonical (PyTorch) layout and each family.

Families: "eqx" (Equinox: channels-first, per-sample), "flax" (Linen and NNX share their
parameter layouts) and "torch" (the canonical layout itself). Every rule maps a layer's canonical
arrays (PyTorch `state_dict` names without the layer prefix) to the family's native arrays and
back, exactly (transposes, flips and reshapes only: no arithmetic, so round trips are bitwise).
docs/conventions.md states each rule and the test that pins it.

Arrays may be numpy or JAX arrays: rules use only `.transpose`, `.reshape`, `.swapaxes` and
slicing, which both provide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Arrays = dict[str, Any]

KINDS = ("linear", "conv", "conv_transpose", "batch_norm")


def flip_spatial(w: Any, first_spatial: int = 2) -> Any:
    """Reverse every axis from `first_spatial` on (the kernel's spatial axes)."""
    n = w.ndim - first_spatial
    return w[(slice(None),) * first_spatial + (slice(None, None, -1),) * n]


def channels_last_kernel(w: Any) -> Any:
    """(A, B, *k) -> (*k, B, A): PyTorch conv weight (O, I, *k) to Flax (*k, I, O)."""
    n = w.ndim - 2
    return w.transpose(*range(2, 2 + n), 1, 0)


def channels_first_kernel(k: Any) -> Any:
    """(*k, B, A) -> (A, B, *k): the inverse of `channels_last_kernel`."""
    n = k.ndim - 2
    return k.transpose(n + 1, n, *range(n))


def bias_eqx(b: Any, ndim: int) -> Any:
    """Equinox conv biases carry singleton spatial axes: (O,) -> (O, 1, ..., 1)."""
    return b.reshape(b.shape[0], *(1,) * ndim)


@dataclass(frozen=True)
class Layer:
    """A parameterised layer found in a model tree."""

    name: str  # canonical prefix, e.g. "conv1" or "blocks.0.fc"
    kind: str  # one of KINDS
    spatial_dims: int = 0
    flatten_shape: tuple[int, ...] | None = None  # (C, *spatial) if the input is flattened
    has_bias: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def _linear_flax_kernel(w: Any, layer: Layer) -> Any:
    """Canonical (out, in) -> Flax (in, out); a flattened (C, *sp) input becomes (*sp, C) order."""
    if layer.flatten_shape is None:
        return w.T
    c, *sp = layer.flatten_shape
    out = w.shape[0]
    perm = (*range(2, 2 + len(sp)), 1, 0)
    return w.reshape(out, c, *sp).transpose(*perm).reshape(-1, out)


def _linear_canonical_weight(k: Any, layer: Layer) -> Any:
    if layer.flatten_shape is None:
        return k.T
    c, *sp = layer.flatten_shape
    out = k.shape[1]
    n = len(sp)
    return k.reshape(*sp, c, out).transpose(n + 1, n, *range(n)).reshape(out, -1)


def _with_bias(native: Arrays, canon: Arrays, layer: Layer, bias: Callable[[Any], Any]) -> Arrays:
    if layer.has_bias:
        native["bias"] = bias(canon["bias"])
    return native


# Equinox flattens (C, *spatial) as PyTorch does, so only Flax permutes flattened inputs.
def linear_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    if family == "eqx":
        return _with_bias({"weight": c["weight"]}, c, layer, lambda b: b)
    return _with_bias({"kernel": _linear_flax_kernel(c["weight"], layer)}, c, layer, lambda b: b)


def linear_to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    if family == "eqx":
        return _with_bias({"weight": n["weight"]}, n, layer, lambda b: b)
    return _with_bias({"weight": _linear_canonical_weight(n["kernel"], layer)}, n, layer,
                      lambda b: b)


def conv_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    if family == "eqx":
        return _with_bias({"weight": c["weight"]}, c, layer,
                          lambda b: bias_eqx(b, layer.spatial_dims))
    return _with_bias({"kernel": channels_last_kernel(c["weight"])}, c, layer, lambda b: b)


def conv_to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    if family == "eqx":
        return _with_bias({"weight": n["weight"]}, n, layer, lambda b: b.reshape(-1))
    return _with_bias({"weight": channels_first_kernel(n["kernel"])}, n, layer, lambda b: b)


def conv_transpose_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    """PyTorch (I, O, *k) -> Equinox (O, I, *k) flipped, Flax (*k, I, O) flipped."""
    w = flip_spatial(c["weight"])
    if family == "eqx":
        return _with_bias({"weight": w.swapaxes(0, 1)}, c, layer,
                          lambda b: bias_eqx(b, layer.spatial_dims))
    # channels_last_kernel maps (A, B, *k) -> (*k, B, A); we need (*k, I, O) from (I, O, *k).
    return _with_bias({"kernel": channels_last_kernel(w.swapaxes(0, 1))}, c, layer, lambda b: b)


def conv_transpose_to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    if family == "eqx":
        w = n["weight"].swapaxes(0, 1)
        return _with_bias({"weight": flip_spatial(w)}, n, layer, lambda b: b.reshape(-1))
    w = channels_first_kernel(n["kernel"]).swapaxes(0, 1)
    return _with_bias({"weight": flip_spatial(w)}, n, layer, lambda b: b)


_SCALE = {"eqx": "weight", "flax": "scale"}


def batch_norm_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    """Running statistics are copied as stored (see docs/conventions.md on the variance)."""
    return {_SCALE[family]: c["weight"], "bias": c["bias"], "mean": c["running_mean"],
            "var": c["running_var"]}


def batch_norm_to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    """The JAX libraries keep no batch counter: `num_batches_tracked` is written as 0."""
    return {"weight": n[_SCALE[family]], "bias": n["bias"], "running_mean": n["mean"],
            "running_var": n["var"], "num_batches_tracked": np.zeros((), np.int64)}


RULES: dict[str, tuple[Callable[..., Arrays], Callable[..., Arrays]]] = {
    "linear": (linear_to_native, linear_to_canonical),
    "conv": (conv_to_native, conv_to_canonical),
    "conv_transpose": (conv_transpose_to_native, conv_transpose_to_canonical),
    "batch_norm": (batch_norm_to_native, batch_norm_to_canonical),
}


def to_native(family: str, canonical: Arrays, layer: Layer) -> Arrays:
    """The layer's native arrays from its canonical arrays (keys without the layer prefix)."""
    if family == "torch":  # PyTorch's own layout is the canonical one
        return dict(canonical)
    return RULES[layer.kind][0](family, canonical, layer)


def to_canonical(family: str, native: Arrays, layer: Layer) -> Arrays:
    """The layer's canonical arrays from its native arrays."""
    if family == "torch":
        return dict(native)
    return RULES[layer.kind][1](family, native, layer)
