"""The roofline of a conv-transpose: the least memory traffic and the useful FLOPs of a step.

`convt_roofline` is a pure function of the layer's shapes. Useful FLOPs are those of a
conv-transpose *without* the zeros that the `lhs_dilation` / `pad` formulations insert:
``2 * N * C_in * C_out * prod(k) * prod(input spatial)`` (every input voxel meets every kernel
tap once), less the products that land in the cropped `padding` border (counted exactly per
dim; 1.5% of the total for k3 p1 on 64^3, 0.4% on 256^3). Minimum bytes: read the input and the
weights once, write the output once. A training step adds the weight gradient (the same
multiply-adds again, a weight-sized write) and, when the layer's input needs a gradient (not
for the first layer of a network, nor for the single `convt` layer), the input gradient (the
same multiply-adds again, an input-sized write). Roofline time = ``max(bytes / peak bandwidth,
FLOPs / peak FLOP/s)``; measured time / roofline time is the "× roofline" of the reports (1.0 =
at the roof). A model made of conv-transposes only (Decoder3D) has the sum over them as its
roofline, each reading its input and writing its output (an unfused, layer-by-layer lower
bound; activations, loss and optimizer are not counted).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import jax.numpy as jnp

from zoo.bench.spec import SubjectConfig
from zoo.configs import Config
from zoo.layers.conv_transpose import output_shape
from zoo.layers.conv_transpose_spec import conv_transposes_of
from zoo.registry import schema


@dataclass(frozen=True)
class Roofline:
    """Useful FLOPs and minimum bytes of one step; `time_s` once peaks are known."""

    flops: float
    bytes: float

    def time_s(self, peak_flops_per_s: float | None,
               peak_bytes_per_s: float | None) -> float | None:
        """max(bytes / bandwidth, FLOPs / FLOP rate); None without any peak."""
        parts = []
        if peak_bytes_per_s:
            parts.append(self.bytes / peak_bytes_per_s)
        if peak_flops_per_s:
            parts.append(self.flops / peak_flops_per_s)
        return max(parts) if parts else None

    def __add__(self, other: Roofline) -> Roofline:
        return Roofline(self.flops + other.flops, self.bytes + other.bytes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _useful_taps(n_in: int, k: int, s: int, p: int, n_out: int, d: int) -> int:
    """(input index, kernel tap) pairs of one dim that land inside the output: n_in * k minus
    the taps that fall into the cropped `padding` border."""
    return sum(1 for i in range(n_in) for t in range(k) if 0 <= i * s - p + t * d < n_out)


def convt_roofline(batch: int, in_channels: int, out_channels: int,
                   spatial: tuple[int, ...], kernel_size: int | tuple[int, ...],
                   stride: int | tuple[int, ...] = 1, padding: int | tuple[int, ...] = 0,
                   output_padding: int | tuple[int, ...] = 0, dilation: int | tuple[int, ...] = 1,
                   *, itemsize: int = 4, mode: str = "forward", bias: bool = True,
                   input_grad: bool = False) -> Roofline:
    """Roofline of one conv-transpose (PyTorch hyper-parameters; ints apply to every dim).

    forward: FLOPs ``2 N Ci Co prod(k) prod(spatial)``, less the taps that land in the cropped
    padding border (exact count per dim; negligible at large sizes); bytes = input + weights
    (+ bias) + output. train: + the weight gradient (same FLOPs, weight-sized write) and, with
    `input_grad`, the input gradient (same FLOPs, input-sized write): x2 or x3 the FLOPs.
    """
    n = len(spatial)
    per = lambda v: (v,) * n if isinstance(v, int) else tuple(v)
    k = per(kernel_size)
    out_spatial = output_shape(tuple(spatial), k, per(stride), per(padding), per(output_padding),
                               per(dilation))
    taps = math.prod(_useful_taps(*a) for a in zip(spatial, k, per(stride), per(padding),
                                                    out_spatial, per(dilation), strict=True))
    macs = batch * in_channels * out_channels * taps
    x_elems = batch * in_channels * math.prod(spatial)
    w_elems = in_channels * out_channels * math.prod(k) + (out_channels if bias else 0)
    y_elems = batch * out_channels * math.prod(out_spatial)
    flops = 2.0 * macs
    elems = x_elems + w_elems + y_elems
    if mode == "train":
        flops += 2.0 * macs  # weight gradient
        elems += w_elems  # the gradient written
        if input_grad:
            flops += 2.0 * macs
            elems += x_elems
    elif mode != "forward":
        raise ValueError(f"mode must be 'forward' or 'train', got {mode!r}")
    return Roofline(flops, float(elems * itemsize))


def model_roofline(config: SubjectConfig, batch: int, dtype: str, mode: str
                   ) -> Roofline | None:
    """The roofline of a model made of conv-transposes (a `ConvTSpec`, a decoder): the sum over
    its `conv_transposes()` (`conv_transposes_of`), every layer but the first also computing its
    input gradient in training. None for models with other layers."""
    specs = conv_transposes_of(config)
    if not specs or (isinstance(config, Config) and any(
            layer.kind != "conv_transpose" for layer in schema(config)[0])):
        return None
    itemsize = jnp.dtype(dtype).itemsize
    total = Roofline(0.0, 0.0)
    for i, sp in enumerate(specs):
        total = total + convt_roofline(
            batch, sp.in_channels, sp.out_channels, sp.input_size, sp.kernel_size, sp.stride,
            sp.padding, sp.output_padding, sp.dilation, itemsize=itemsize, mode=mode,
            input_grad=i > 0)
    return total
