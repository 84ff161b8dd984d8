"""Stride-1 VALID convolution as explicit im2col + GEMM, a block of output slices at a time.

XLA:CPU runs 3-D convolutions with few channels far below its matrix-multiply speed (the
`convt-256-cpu` forward: 299 ms as a convolution, 10-14 ms as GEMMs, on a 2-core VM). This module
computes the same convolution with matrix multiplies only:

- **forward**: for each position along the first spatial axis (a `lax.scan`), the input rows
  that position reads are gathered into a patch matrix `(N * rest of the slice, taps * C)`
  (im2col, built from static slices of a small block, so it stays in cache) and multiplied by
  the kernel reshaped to `(taps * C, O)`;
- **input gradient** (a custom VJP): the same routine on the cotangent padded by `d (k - 1)`
  with the spatially flipped, I/O-swapped kernel (a full correlation);
- **weight gradient**: the scan again, accumulating `dy_slice^T @ patches` in float32.

Where the patch matrix is the wider operand (few output channels), the taps of the last spatial
axis are folded into the GEMM's output instead (`_folds`): patches over the other axes' taps
times a `(taps' * C, k_last * O)` kernel, then `k_last` shifted row slices summed (the weight
gradient stacks the cotangent's shifts the same way). The decoder's 4-channel k3 head runs its
forward 2.5x faster so.

The loop keeps the patch matrix within `SLAB_BYTES` (`_block`): several output slices per step
for small volumes, whose per-step cost would otherwise dominate (a 16^3 layer at batch 1:
2.3-2.5x faster in one step than in 16); for large ones (a whole-volume im2col of a 64^3 volume
with a 3^3 kernel is 27x the input) one slice, cut into blocks of rows of the second axis when
it alone exceeds the budget, so that the patches stay near the caches (the U-Net's training
step 0.92x the time, the decoder's 0.91x, against whole slices). It compiles in about a
second; unrolling the loop took 70 s to compile and ran slower. XLA's cost analysis counts a
loop body once: `zoo.bench.flops` multiplies the matrix multiplies of every loop body by its
known trip count, so benchmarks count the work done.
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

# Patch-matrix bytes per loop step that several output slices may share. Measured on the
# 2-core VM, NNX, against one slice per step (interleaved, paired medians): 4 MiB ran the
# 16^3 conv-transpose layer at batch 1 (`convt` preset `cpu`) 0.43x the time forward and 0.40x
# training, the decoder's training step 0.92x, the U-Net's 1.01x (its 64^3 and 32^3 slices are
# larger than this anyway); 1 MiB gained less (0.73, 0.76, 0.97), 16 MiB lost on the decoder
# (1.16x). With slices cut into row blocks, 2 MiB ran the U-Net's forward 1.03x and 1 MiB 1.16x.
SLAB_BYTES = 4 << 20


def _folds(k: tuple[int, ...], c: int, o: int) -> bool:
    """Whether to fold the last axis's taps into the GEMM's output columns: the patch matrix
    then holds `prod(k[:-1]) * C` columns instead of `prod(k) * C` and the product `k[-1] * O`
    (summed at shifted rows afterwards). Worth it when the patches are the wider side (the
    decoder's 4-channel k3 head: 2.5x faster forward)."""
    return len(k) > 1 and math.prod(k[:-1]) * c >= 2 * o


def _block(x: jax.Array, k: tuple[int, ...], out: tuple[int, ...],
           fold: bool) -> tuple[int, int]:
    """(output slices, rows of the second spatial axis) per loop step, divisors of `out[0]`
    and `out[1]`, with a patch matrix within `SLAB_BYTES`. Small volumes take several slices
    (the loop's per-step cost paid fewer times); a slice larger than the budget, with 3 or more
    spatial axes, is split into blocks of rows (at least one), so that the patch matrix stays
    small enough for the caches; otherwise one slice, whole."""
    taps = math.prod(k[:-1] if fold else k)
    rest = (*out[1:-1], x.shape[-2]) if fold else out[1:]
    per_slice = x.shape[0] * math.prod(rest) * taps * x.shape[-1] * x.dtype.itemsize
    fits = SLAB_BYTES // max(per_slice, 1)
    whole = out[1] if len(k) > 1 else 1
    if fits >= 1 or len(k) < 3:
        return max(s for s in range(1, min(max(fits, 1), out[0]) + 1) if out[0] % s == 0), whole
    rows = SLAB_BYTES * out[1] // per_slice
    return 1, max(r for r in range(1, max(rows, 1) + 1) if out[1] % r == 0)


def _patches(block: jax.Array, k: tuple[int, ...], d: tuple[int, ...],
             out_rest: tuple[int, ...], fold: bool, slab: int) -> jax.Array:
    """(N, span_0, *rest, C) -> (rows, taps * C), taps major, C minor, rows over `(N, slab,
    ...)`. Unfolded: every tap of `k`, rows over `out_rest`. Folded: the taps of `k[:-1]`,
    rows over `out_rest[:-1]` and the whole last input axis."""
    taps = k[:-1] if fold else k  # folded: the last axis is left whole (not indexed)
    cols = [block[(slice(None), slice(t[0] * d[0], t[0] * d[0] + slab),
                   *(slice(tj * dj, tj * dj + o)
                     for tj, dj, o in zip(t[1:], d[1:], out_rest, strict=False)))]
            for t in itertools.product(*map(range, taps))]
    p = jnp.concatenate(cols, axis=-1) if len(cols) > 1 else cols[0]
    return p.reshape(-1, p.shape[-1])


def _slices(x: jax.Array, k: tuple[int, ...], d: tuple[int, ...], out: tuple[int, ...],
            at: tuple[jax.Array, jax.Array], fold: bool, block: tuple[int, int]) -> jax.Array:
    """The patch matrix of output slices `at[0], ..., at[0] + block[0] - 1` (first spatial
    axis) and rows `at[1], ..., at[1] + block[1] - 1` (second) of channels-last `x`."""
    slab, rows = block
    if len(k) < 3:  # the second axis (if any) whole: the folded last axis is never cut
        part = lax.dynamic_slice_in_dim(x, at[0], d[0] * (k[0] - 1) + slab, axis=1)
        return _patches(part, k, d, out[1:], fold, slab)
    part = lax.dynamic_slice(x, (0, at[0], at[1], *(0,) * (x.ndim - 3)),
                             (x.shape[0], d[0] * (k[0] - 1) + slab, d[1] * (k[1] - 1) + rows,
                              *x.shape[3:]))
    return _patches(part, k, d, (rows, *out[2:]), fold, slab)


def _starts(out: tuple[int, ...], block: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
    """The loop's (slice, row) starts, slices major."""
    rows = range(0, out[1], block[1]) if len(out) > 1 else (0,)
    starts = [(i, j) for i in range(0, out[0], block[0]) for j in rows]
    return tuple(jnp.asarray(v, jnp.int32) for v in zip(*starts, strict=True))


def _out(x: jax.Array, k: tuple[int, ...], d: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s - dj * (kj - 1) for s, kj, dj in zip(x.shape[1:-1], k, d, strict=True))


def _forward(x: jax.Array, w: jax.Array, k: tuple[int, ...], d: tuple[int, ...],
             precision: Any, out_type: Any) -> jax.Array:
    """VALID stride-1 correlation of `x` (N, *sp, C) with `w` (*k, C, O)."""
    c, o = w.shape[-2:]
    out, fold = _out(x, k, d), _folds(k, c, o)
    n, last = len(k), k[-1]
    # folded: (*k[:-1], C, k_last, O) -> (prod(k[:-1]) * C, k_last * O)
    w2 = jnp.moveaxis(w, n - 1, n).reshape(-1, last * o) if fold else w.reshape(-1, o)

    block = _block(x, k, out, fold)
    part = (block[0], *((block[1], *out[2:]) if n > 1 else ()))  # one step's output block

    def body(_: None, at: tuple[jax.Array, jax.Array]) -> tuple[None, jax.Array]:
        z = jnp.matmul(_slices(x, k, d, out, at, fold, block), w2, precision=precision,
                       preferred_element_type=out_type)
        if not fold:
            return None, z.reshape(x.shape[0], *part, o)
        z = z.reshape(x.shape[0], *part[:-1], x.shape[-2], last, o)
        return None, sum(z[..., t * d[-1]:t * d[-1] + out[-1], t, :] for t in range(last))

    _, ys = lax.scan(body, None, _starts(out, block))  # (steps, N, slab, [rows], *rest, O)
    by_rows = out[1] // block[1] if n > 1 else 1
    ys = ys.reshape(out[0] // block[0], by_rows, *ys.shape[1:])
    ys = ys.transpose(2, 0, 3, 1, *range(4, ys.ndim))  # (N, steps, slab, row steps, ...)
    return ys.reshape(x.shape[0], *out, ys.shape[-1])


def _weight_grad(x: jax.Array, dy: jax.Array, k: tuple[int, ...], d: tuple[int, ...],
                 precision: Any) -> jax.Array:
    """sum over positions of patches^T dy, as float32 `(*k, C, O)`, one output slice per scan
    step; folded, the cotangent's k_last row shifts are stacked instead of the input's taps."""
    c, o = x.shape[-1], dy.shape[-1]
    out, fold = dy.shape[1:-1], _folds(k, c, o)
    n, last, in_last = len(k), k[-1], x.shape[-2]

    def rows(dy_i: jax.Array) -> jax.Array:
        if not fold:
            return dy_i.reshape(-1, o)
        pads = [[(0, 0)] * (dy_i.ndim - 2) + [(t * d[-1], in_last - out[-1] - t * d[-1]), (0, 0)]
                for t in range(last)]
        return jnp.concatenate([jnp.pad(dy_i, p) for p in pads], axis=-1).reshape(-1, last * o)

    block = _block(x, k, out, fold)
    cut = 2 + (n > 2)  # dy's axes cut per step: N, slices, and rows where they are split

    def body(acc: jax.Array, at: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        part = lax.dynamic_slice(dy, (0, *at[:cut - 1], *(0,) * (dy.ndim - cut)),
                                 (dy.shape[0], *block[:cut - 1], *dy.shape[cut:]))
        dy_i = rows(part)
        patches = _slices(x, k, d, out, at, fold, block)
        return acc + jnp.matmul(dy_i.T, patches, precision=precision,
                                preferred_element_type=jnp.float32), None

    taps = math.prod(k[:-1]) if fold else math.prod(k)
    acc, _ = lax.scan(body, jnp.zeros(((last if fold else 1) * o, taps * c), jnp.float32),
                      _starts(out, block))
    if not fold:
        return acc.T.reshape(*k, c, o)
    # (k_last, O, *k[:-1], C) -> (*k[:-1], k_last, C, O)
    acc = acc.reshape(last, o, *k[:-1], c)
    return acc.transpose(*range(2, n + 1), 0, n + 1, 1)


def _pad(x: jax.Array, pads: tuple[tuple[int, int], ...]) -> jax.Array:
    """Zero-pad (a negative width crops) the spatial axes of channels-last `x`."""
    if not any(lo or hi for lo, hi in pads):
        return x
    return lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), *((lo, hi, 0) for lo, hi in pads),
                                               (0, 0, 0)])


@functools.cache
def _conv(k: tuple[int, ...], d: tuple[int, ...], pads: tuple[tuple[int, int], ...],
          precision: Any, out_type: Any) -> Any:
    """The custom-VJP convolution `(x (N, *sp, C), w (*k, C, O)) -> (N, *out, O)` of `x`
    zero-padded by `pads`. The padding is part of it: the input gradient is the full
    correlation of the cotangent restricted to the unpadded input (the cotangent padded by
    `d (k - 1) - pad` per side), not computed over the padded volume and cropped."""
    n = len(k)

    @jax.custom_vjp
    def conv_(x: jax.Array, w: jax.Array) -> jax.Array:
        return _forward(_pad(x, pads), w, k, d, precision, out_type)

    def fwd(x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple]:
        return conv_(x, w), (x, w)

    def bwd(res: tuple, dy: jax.Array) -> tuple[jax.Array, jax.Array]:
        x, w = res
        inner = tuple((dj * (kj - 1) - lo, dj * (kj - 1) - hi)
                      for kj, dj, (lo, hi) in zip(k, d, pads, strict=True))
        w_t = jnp.flip(w, tuple(range(n))).swapaxes(-1, -2).astype(dy.dtype)
        dx = _forward(_pad(dy, inner), w_t, k, d, precision, None).astype(x.dtype)
        dw = _weight_grad(_pad(x.astype(dy.dtype), pads), dy, k, d, precision)
        return dx, dw.astype(w.dtype)

    conv_.defvjp(fwd, bwd)
    return conv_


def conv(x: jax.Array, kernel: jax.Array, dn: lax.ConvDimensionNumbers,
         rhs_dilation: tuple[int, ...], padding: tuple[tuple[int, int], ...] | None = None,
         *, precision: Any = None, preferred_element_type: Any = None) -> jax.Array:
    """`lax.conv_general_dilated(x, kernel, (1,) * n, padding, rhs_dilation=rhs_dilation,
    dimension_numbers=dn, ...)` computed as im2col + GEMM (same values up to float rounding).

    Any layout `dn` (data are moved to channels-last first, then zero-padded by `padding`, one
    `(lo, hi)` >= 0 per spatial dim, default none: padding a channels-first input before the
    move made XLA write the padded copy in a mixed layout and copy it again, 15% of Equinox's
    U-Net forward); any number of spatial dims.
    """
    lhs = x.transpose(dn.lhs_spec[0], *dn.lhs_spec[2:], dn.lhs_spec[1])  # (N, *sp, C)
    rhs = kernel.transpose(*dn.rhs_spec[2:], dn.rhs_spec[1], dn.rhs_spec[0])  # (*k, I, O)
    k, d = tuple(rhs.shape[:-2]), tuple(int(v) for v in rhs_dilation)
    pads = tuple((int(lo), int(hi)) for lo, hi in padding) if padding else ((0, 0),) * len(k)
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        raise ValueError(f"im2col convolution padding must be >= 0, got {pads}")
    if isinstance(precision, list):
        precision = tuple(precision)
    y = _conv(k, d, pads, precision, preferred_element_type)(lhs, rhs)
    # y holds the logical dims (N, *spatial, C); out_spec[l] is the axis of logical dim l.
    order = [0, *range(2, y.ndim), 1]
    return y.transpose([order.index(dn.out_spec.index(a)) for a in range(y.ndim)])
