"""Convolutions of 3 or more spatial dims as im2col + GEMM on the CPU.

XLA:CPU runs 3-D convolutions far below its matrix-multiply speed: the 3-D U-Net's largest
layer (16 -> 16 channels, 3^3 kernel, 64^3, batch 2) takes 469 ms forward and 1.82 s forward +
both gradients as an XLA convolution, 103 ms and 284 ms as the zoo's im2col + GEMM
(`zoo.layers.im2col`, the formulation the conv-transposes use), 2-core VM, idle. PyTorch
(oneDNN) runs the U-Net 4.6x (forward) to 4.9x (training step) faster than XLA's convolutions
do. `conv_general_dilated` is a drop-in for `lax.conv_general_dilated` that computes such
convolutions (stride 1, any padding >= 0, dilation, layout) with im2col on the CPU and leaves
every other case to XLA. Flax's `Conv` takes it as its `conv_general_dilated` argument; the
Equinox `Conv` of `zoo.layers.eqx` calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax import lax

from zoo.layers import im2col

__all__ = ["conv_general_dilated", "uses_im2col"]

# From this many spatial dims on, the CPU's convolutions (and conv-transposes, whose "auto"
# method reads it too) are im2col + GEMM; 2-D ones: XLA's own is faster
# (docs/investigations/cpu_timings.md).
IM2COL_MIN_SPATIAL_DIMS = 3


def uses_im2col(n_spatial: int, window_strides: Sequence[int], lhs_dilation: Sequence[int] | None,
                feature_group_count: int, batch_group_count: int, backend: str) -> bool:
    """Whether `conv_general_dilated` computes this convolution with im2col + GEMM."""
    return (backend == "cpu" and n_spatial >= IM2COL_MIN_SPATIAL_DIMS
            and all(s == 1 for s in window_strides)
            and all(d == 1 for d in (lhs_dilation or ()))
            and feature_group_count == 1 and batch_group_count == 1)


def conv_general_dilated(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int],
                         padding: str | Sequence[tuple[int, int]],
                         lhs_dilation: Sequence[int] | None = None,
                         rhs_dilation: Sequence[int] | None = None,
                         dimension_numbers: Any = None, feature_group_count: int = 1,
                         batch_group_count: int = 1, precision: Any = None,
                         preferred_element_type: Any = None, out_sharding: Any = None
                         ) -> jax.Array:
    """`lax.conv_general_dilated`, computed as im2col + GEMM where `uses_im2col` says so (and
    no `out_sharding` is asked for: that one stays XLA's)."""
    n = lhs.ndim - 2
    dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    kernel = [rhs.shape[i] for i in dn.rhs_spec[2:]]
    dilation = tuple(rhs_dilation or (1,) * n)
    if isinstance(padding, str):
        spatial = [lhs.shape[i] for i in dn.lhs_spec[2:]]
        window = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
        padding = lax.padtype_to_pads(spatial, window, window_strides, padding)
    pads = [(int(lo), int(hi)) for lo, hi in padding]
    if (out_sharding is None and all(lo >= 0 and hi >= 0 for lo, hi in pads)
            and uses_im2col(n, window_strides, lhs_dilation, feature_group_count,
                            batch_group_count, jax.default_backend())):
        return im2col.conv(lhs, rhs, dn, dilation, tuple(pads), precision=precision,
                           preferred_element_type=preferred_element_type)
    return lax.conv_general_dilated(
        lhs, rhs, window_strides, pads, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
        batch_group_count=batch_group_count, precision=precision,
        preferred_element_type=preferred_element_type,
        **({} if out_sharding is None else {"out_sharding": out_sharding}))
