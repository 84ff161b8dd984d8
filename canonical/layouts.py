"""Parameter layouts ("families"): how a group of libraries names and lays out layer arrays.

Linen and NNX share one layout ("flax"); Equinox has its own ("eqx"); PyTorch's ("torch") is the
canonical layout itself. The layer rules (`canonical.rules`) read these facts instead of
branching on a family's name, so a new layout is one `register_layout(Layout(...))` call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def channels_last_kernel(w: Any) -> Any:
    """(A, B, *k) -> (*k, B, A): PyTorch conv weight (O, I, *k) to Flax (*k, I, O)."""
    n = w.ndim - 2
    return w.transpose(*range(2, 2 + n), 1, 0)


def channels_first_kernel(k: Any) -> Any:
    """(*k, B, A) -> (A, B, *k): the inverse of `channels_last_kernel`."""
    n = k.ndim - 2
    return k.transpose(n + 1, n, *range(n))


@dataclass(frozen=True)
class Layout:
    """The facts of one parameter layout the rules need.

    - `kernel`, `scale`, `embedding`: the native names of a linear / conv weight, a norm's
      weight and an embedding table (canonical: "weight" for all three).
    - `channels_last`: kernels are (*k, in, out) and a linear layer's input (in, out), its
      flattened feature maps in (*spatial, C) order.
    - `spatial_bias`: conv biases carry singleton spatial axes, (O, 1, ..., 1).
    - `canonical`: the arrays are already canonical (rules apply only where a kind names
      arrays of its own for this layout).
    - `collections`: native trees group arrays by collection, and may wrap them in variables
      (Flax: `params` / `batch_stats`, NNX `.value` leaves).
    """

    name: str
    kernel: str = "weight"
    scale: str = "weight"
    embedding: str = "weight"
    channels_last: bool = False
    spatial_bias: bool = False
    canonical: bool = False
    collections: bool = False

    def conv_kernel(self, w: Any) -> Any:
        return channels_last_kernel(w) if self.channels_last else w

    def conv_kernel_back(self, k: Any) -> Any:
        return channels_first_kernel(k) if self.channels_last else k

    def conv_bias(self, b: Any, weight: Any) -> Any:
        return b.reshape(b.shape[0], *(1,) * (weight.ndim - 2)) if self.spatial_bias else b

    def conv_bias_back(self, b: Any) -> Any:
        return b.reshape(-1) if self.spatial_bias else b

    def dense_kernel(self, w: Any, flatten_shape: tuple[int, ...] | None) -> Any:
        """Canonical (out, in) -> native; a flattened (C, *sp) input reorders to (*sp, C)."""
        if not self.channels_last:
            return w
        if flatten_shape is None:
            return w.T
        c, *sp = flatten_shape
        out = w.shape[0]
        return w.reshape(out, c, *sp).transpose(*range(2, 2 + len(sp)), 1, 0).reshape(-1, out)

    def dense_kernel_back(self, k: Any, flatten_shape: tuple[int, ...] | None) -> Any:
        if not self.channels_last:
            return k
        if flatten_shape is None:
            return k.T
        c, *sp = flatten_shape
        out, n = k.shape[1], len(sp)
        return k.reshape(*sp, c, out).transpose(n + 1, n, *range(n)).reshape(out, -1)


LAYOUTS: dict[str, Layout] = {}


def register_layout(layout: Layout) -> Layout:
    LAYOUTS[layout.name] = layout
    return layout


def layout(name: str) -> Layout:
    """The layout called `name` (a ValueError names the known ones)."""
    if name not in LAYOUTS:
        raise ValueError(f"unknown parameter layout {name!r}; known: {sorted(LAYOUTS)}")
    return LAYOUTS[name]


EQX = register_layout(Layout("eqx", spatial_bias=True))
FLAX = register_layout(Layout("flax", kernel="kernel", scale="scale", embedding="embedding",
                              channels_last=True, collections=True))
TORCH = register_layout(Layout("torch", canonical=True))
