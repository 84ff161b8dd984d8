"""Stride-1 VALID convolution as explicit im2col + GEMM, one output slice at a time.

XLA:CPU runs 3-D convolutions with few channels far below its matrix-multiply speed (the
`convt-256-cpu` forward: 305 ms as a convolution, 39 ms as GEMMs, on a 2-core VM). This module
computes the same convolution with matrix multiplies only:

- **forward**: for each position along the first spatial axis (a `lax.scan`), the input rows
  that position reads are gathered into a patch matrix `(N * rest of the slice, taps * C)`
  (im2col, built from static slices of a small block, so it stays in cache) and multiplied by
  the kernel reshaped to `(taps * C, O)`;
- **input gradient** (a custom VJP): the same routine on the cotangent padded by `d (k - 1)`
  with the spatially flipped, I/O-swapped kernel (a full correlation);
- **weight gradient**: the scan again, accumulating `dy_slice^T @ patches` in float32.

The loop keeps the patch matrix one slice big (a whole-volume im2col of a 64^3 volume with a
3^3 kernel is 27x the input) and compiles in about a second; unrolling it took 70 s to compile
and ran slower. XLA's cost analysis counts a loop body once: `zoo.bench.flops` multiplies the
matrix multiplies of every loop body by its known trip count, so benchmarks count the work done.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["conv"]


def _patches(block: jax.Array, k: tuple[int, ...], d: tuple[int, ...],
             out_rest: tuple[int, ...]) -> jax.Array:
    """(N, span_0, *rest, C) -> (N * prod(out_rest), prod(k) * C); taps major, C minor (the
    order of a `(*k, C, O)` kernel reshaped to `(prod(k) * C, O)`)."""
    cols = [block[(slice(None), t[0] * d[0],
                   *(slice(tj * dj, tj * dj + o) for tj, dj, o in zip(t[1:], d[1:], out_rest,
                                                                        strict=True)))]
            for t in itertools.product(*map(range, k))]
    p = jnp.concatenate(cols, axis=-1) if len(cols) > 1 else cols[0]
    return p.reshape(-1, p.shape[-1])


def _slices(x: jax.Array, k: tuple[int, ...], d: tuple[int, ...], out: tuple[int, ...],
            i: jax.Array) -> jax.Array:
    """The patch matrix of output slice `i` (first spatial axis) of channels-last `x`."""
    block = lax.dynamic_slice_in_dim(x, i, d[0] * (k[0] - 1) + 1, axis=1)
    return _patches(block, k, d, out[1:])


def _forward(x: jax.Array, w2: jax.Array, k: tuple[int, ...], d: tuple[int, ...],
             precision: Any, out_type: Any) -> jax.Array:
    """VALID stride-1 correlation of `x` (N, *sp, C) with `w2` (prod(k) * C, O)."""
    out = tuple(s - dj * (kj - 1) for s, kj, dj in zip(x.shape[1:-1], k, d, strict=True))

    def body(_: None, i: jax.Array) -> tuple[None, jax.Array]:
        y = jnp.matmul(_slices(x, k, d, out, i), w2, precision=precision,
                       preferred_element_type=out_type)
        return None, y.reshape(x.shape[0], *out[1:], w2.shape[-1])

    _, ys = lax.scan(body, None, jnp.arange(out[0]))  # (out_0, N, *out_rest, O)
    return jnp.moveaxis(ys, 0, 1)


@functools.cache
def _conv(k: tuple[int, ...], d: tuple[int, ...], precision: Any, out_type: Any) -> Any:
    """The custom-VJP convolution `(x (N, *sp, C), w (*k, C, O)) -> (N, *out, O)`."""
    n = len(k)

    @jax.custom_vjp
    def conv_(x: jax.Array, w: jax.Array) -> jax.Array:
        return _forward(x, w.reshape(-1, w.shape[-1]), k, d, precision, out_type)

    def fwd(x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple]:
        return conv_(x, w), (x, w)

    def bwd(res: tuple, dy: jax.Array) -> tuple[jax.Array, jax.Array]:
        x, w = res
        c, o = w.shape[-2:]
        full = [(0, 0), *((dj * (kj - 1),) * 2 for kj, dj in zip(k, d, strict=True)), (0, 0)]
        w_t = jnp.flip(w, tuple(range(n))).swapaxes(-1, -2).reshape(-1, c).astype(dy.dtype)
        dx = _forward(jnp.pad(dy, full), w_t, k, d, precision, None).astype(x.dtype)
        out = dy.shape[1:-1]
        x_t = x.astype(dy.dtype)

        def body(acc: jax.Array, i: jax.Array) -> tuple[jax.Array, None]:
            dy_i = lax.dynamic_index_in_dim(dy, i, axis=1, keepdims=False).reshape(-1, o)
            return acc + jnp.matmul(dy_i.T, _slices(x_t, k, d, out, i), precision=precision,
                                    preferred_element_type=jnp.float32), None

        acc, _ = lax.scan(body, jnp.zeros((o, math.prod(k) * c), jnp.float32),
                          jnp.arange(out[0]))
        return dx, acc.T.reshape(w.shape).astype(w.dtype)

    conv_.defvjp(fwd, bwd)
    return conv_


def conv(x: jax.Array, kernel: jax.Array, dn: lax.ConvDimensionNumbers,
         rhs_dilation: tuple[int, ...], *, precision: Any = None,
         preferred_element_type: Any = None) -> jax.Array:
    """`lax.conv_general_dilated(x, kernel, (1,) * n, "VALID", rhs_dilation=rhs_dilation,
    dimension_numbers=dn, ...)` computed as im2col + GEMM (same values up to float rounding).

    Any layout `dn` (data are moved to channels-last internally); any number of spatial dims.
    """
    lhs = x.transpose(dn.lhs_spec[0], *dn.lhs_spec[2:], dn.lhs_spec[1])  # (N, *sp, C)
    rhs = kernel.transpose(*dn.rhs_spec[2:], dn.rhs_spec[1], dn.rhs_spec[0])  # (*k, I, O)
    k, d = tuple(rhs.shape[:-2]), tuple(int(v) for v in rhs_dilation)
    if isinstance(precision, list):
        precision = tuple(precision)
    y = _conv(k, d, precision, preferred_element_type)(lhs, rhs)
    # y holds the logical dims (N, *spatial, C); out_spec[l] is the axis of logical dim l.
    order = [0, *range(2, y.ndim), 1]
    return y.transpose([order.index(dn.out_spec.index(a)) for a in range(y.ndim)])
