"""Functional transposed convolution with PyTorch semantics and interchangeable formulations.

All formulations take the kernel in *correlation form* (spatially flipped PyTorch weight, as stored
by ``flax.linen.ConvTranspose(transpose_kernel=False)`` and ``equinox.nn.ConvTranspose``) and
return the same values up to float rounding:

- ``"lhs_dilation"``: one convolution with ``lhs_dilation=stride`` (what Flax and Equinox do).
- ``"pad"``: zeros interleaved explicitly with ``lax.pad``, then a stride-1 VALID convolution.
- ``"phase"``: sub-pixel decomposition into ``prod(stride)`` stride-1 convolutions of the
  undilated input with the taps that hit each output phase, interleaved afterwards.
- ``"phase_batched"``: the same phases as *one* stride-1 convolution with ``prod(stride) * O``
  output channels: every phase's taps are placed in a common window (zeros where a phase has no
  tap), then the phases are interleaved (depth-to-space). More multiplications when the phases
  have unequal tap counts (k3 s2: 8 vs 27 useful per 8 outputs, i.e. 64/27), but one large
  convolution instead of ``prod(stride)`` small ones, which XLA:CPU runs much faster.
- ``"im2col"``: the convolutions of ``"phase_batched"`` (at stride 1: the padded convolution
  itself) computed as explicit im2col + GEMM, a block of output slices at a time, with a custom VJP
  whose gradients are GEMMs as well (:mod:`zoo.layers.im2col`). No XLA convolution at all: on
  XLA:CPU this is several times faster than any convolution-based method for 3-D layers.
- ``"auto"``: :func:`choose_method` picks one from the backend, shapes, stride and dilation.

XLA CPU defects (jaxlib 0.10.2) that shape the code:

- With stride >= 2 and zero padding in some dim (``p == d*(k-1)``, ``op == 0``, e.g. k2 s2 p1)
  the ``"lhs_dilation"`` formulation (like Flax/Equinox ConvTranspose) can abort the process
  while compiling (convolution operand swap in the algebraic simplifier). ``"pad"`` avoids it with
  an optimization barrier, ``"phase"`` by construction, and ``"auto"`` never picks
  ``"lhs_dilation"`` when a stride is > 1.
- Convolutions with mixed-sign padding (e.g. ``(-1, 1)``) can return wrong values. ``"pad"`` and
  ``"phase"`` pad with ``lax.pad`` and run VALID convolutions only, so neither they nor their
  autodiff transposes carry negative convolution padding.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zoo.layers import im2col
from zoo.layers.conv import IM2COL_MIN_SPATIAL_DIMS

__all__ = [
    "CHOICES",
    "METHODS",
    "choose_method",
    "conv_transpose",
    "output_shape",
    "torch_padding",
]

METHODS: tuple[str, ...] = ("lhs_dilation", "pad", "phase", "phase_batched", "im2col")
CHOICES: tuple[str, ...] = (*METHODS, "auto")  # what a `method=` argument accepts

IntOrSeq = int | Sequence[int]


def _tuple(value: IntOrSeq, n: int, name: str) -> tuple[int, ...]:
    """Broadcast an int to ``n`` dims or check that a sequence has length ``n``."""
    if isinstance(value, int):
        return (value,) * n
    out = tuple(int(v) for v in value)
    if len(out) != n:
        raise ValueError(
            f"{name} must be an int or have {n} entries (one per spatial dim), got {value!r}"
        )
    return out


def _check_args(
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    output_padding: Sequence[int],
    dilation: Sequence[int],
) -> None:
    for name, vals, low in (
        ("kernel_size", kernel_size, 1),
        ("stride", stride, 1),
        ("dilation", dilation, 1),
        ("padding", padding, 0),
        ("output_padding", output_padding, 0),
    ):
        if any(v < low for v in vals):
            raise ValueError(f"{name} entries must be >= {low}, got {tuple(vals)}")
    for op, s, d in zip(output_padding, stride, dilation, strict=True):
        if op >= max(s, d):
            raise ValueError(
                f"output_padding must be smaller than stride or dilation, got output_padding="
                f"{tuple(output_padding)}, stride={tuple(stride)}, dilation={tuple(dilation)}"
            )


def torch_padding(
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    output_padding: Sequence[int],
    dilation: Sequence[int],
) -> tuple[tuple[int, int], ...]:
    """PyTorch ConvTranspose (padding, output_padding) -> explicit Flax/lax pairs per spatial dim:
    (d*(k-1) - p, d*(k-1) - p + op). All args are per-spatial-dim tuples."""
    n = len(kernel_size)
    args = [tuple(a) for a in (kernel_size, stride, padding, output_padding, dilation)]
    if any(len(a) != n for a in args):
        raise ValueError(f"all arguments need {n} entries (one per spatial dim), got {args}")
    _check_args(*args)
    return tuple(
        (d * (k - 1) - p, d * (k - 1) - p + op)
        for k, p, op, d in zip(kernel_size, padding, output_padding, dilation, strict=True)
    )


def output_shape(
    in_spatial: Sequence[int],
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    output_padding: Sequence[int],
    dilation: Sequence[int],
) -> tuple[int, ...]:
    """(i-1)*s - 2p + d(k-1) + op + 1 per dim; ValueError if any is < 1 or if
    output_padding >= max(stride, dilation) (PyTorch's rule)."""
    n = len(in_spatial)
    args = [tuple(a) for a in (kernel_size, stride, padding, output_padding, dilation)]
    if any(len(a) != n for a in args):
        raise ValueError(f"all arguments need {n} entries (one per spatial dim), got {args}")
    _check_args(*args)
    out = tuple(
        (i - 1) * s - 2 * p + d * (k - 1) + op + 1
        for i, k, s, p, op, d in zip(in_spatial, *args, strict=True)
    )
    if any(o < 1 for o in out):
        raise ValueError(
            f"transposed convolution output size {out} is not positive for input spatial size "
            f"{tuple(in_spatial)}, kernel_size={args[0]}, stride={args[1]}, padding={args[2]}, "
            f"output_padding={args[3]}, dilation={args[4]}"
        )
    return out


def choose_method(
    x_shape: Sequence[int],
    kernel_shape: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    backend: str,
) -> str:
    """Formulation used by ``method="auto"`` (pure function of shapes and backend).

    - CPU, 3 or more spatial dims: ``"im2col"`` (any stride). XLA:CPU's 3-D convolutions run far
      below its GEMM speed; im2col + GEMM was 9-31x faster than the convolution at stride 1
      (convt-256-cpu) and 3.0-3.6x faster than ``"phase_batched"`` at stride 2 (convt-wgrad-cpu),
      forward and training, 11-12x on the Decoder3D training step
      (docs/investigations/conv_transpose.md).
    - CPU, 1 or 2 spatial dims (not measured with ``"im2col"``): stride 1 ``"lhs_dilation"`` (a
      plain convolution), else ``"phase_batched"`` (one convolution instead of ``prod(stride)``).
    - GPU/TPU/other: stride 1 ``"lhs_dilation"``, else ``"phase"`` until measured there: it does
      the fewest multiplications and avoids the ``lhs_dilation`` lowering.
    """
    del kernel_shape, dilation  # Kept in the signature for retuning.
    if backend == "cpu" and len(x_shape) - 2 >= IM2COL_MIN_SPATIAL_DIMS:
        return "im2col"
    if all(s == 1 for s in stride):
        return "lhs_dilation"
    return "phase_batched" if backend == "cpu" else "phase"


def _phase_taps(k: int, s: int, d: int, lo: int, r: int) -> tuple[int, int, int, int] | None:
    """Taps of a 1-D kernel that hit output phase ``r`` (outputs ``o = s*m + r``).

    With lhs-dilated input and low padding ``lo``, ``y[o] = sum_t K[t] * x[(o + t*d - lo) / s]``
    over the ``t`` for which the division is exact. For ``o = s*m + r`` these taps are
    ``t0, t0 + s/g, ...`` with ``g = gcd(s, d)``, reading ``x[m + c0 + n*d/g]``. Returns
    ``(t0, tap_step, c0, sub_dilation)``
    or ``None`` if no tap hits the phase.
    """
    for t0 in range(min(k, s)):
        if (r + t0 * d - lo) % s == 0:
            g = math.gcd(s, d)
            return t0, s // g, (r + t0 * d - lo) // s, d // g
    return None


def _parse(
    x: jax.Array, kernel: jax.Array, dimension_numbers: tuple[str, str, str]
) -> lax.ConvDimensionNumbers:
    if len(dimension_numbers) != 3 or not all(isinstance(s, str) for s in dimension_numbers):
        raise ValueError(
            "dimension_numbers must be three strings such as ('NDHWC', 'DHWIO', 'NDHWC'), "
            f"got {dimension_numbers!r}"
        )
    lhs, rhs, out = dimension_numbers
    if not (len(lhs) == len(rhs) == len(out)) or len(lhs) < 3:
        raise ValueError(
            f"dimension_numbers strings must have one equal rank >= 3, got {dimension_numbers}"
        )
    if x.ndim != len(lhs):
        raise ValueError(f"x must have rank {len(lhs)} for layout {lhs!r}, found shape {x.shape}")
    if kernel.ndim != len(rhs):
        raise ValueError(
            f"kernel must have rank {len(rhs)} for layout {rhs!r}, found shape {kernel.shape}"
        )
    dn = lax.conv_dimension_numbers(x.shape, kernel.shape, dimension_numbers)
    c_in, k_in = x.shape[dn.lhs_spec[1]], kernel.shape[dn.rhs_spec[1]]
    if c_in != k_in:
        raise ValueError(
            f"channel mismatch: x of shape {x.shape} ({lhs}) has {c_in} input channels, kernel of "
            f"shape {kernel.shape} ({rhs}) expects {k_in} (its 'I' axis)"
        )
    return dn


def _pad_spatial(x: jax.Array, axes: Sequence[int], pairs: Sequence[tuple[int, int]],
                 interior: Sequence[int] | None = None) -> jax.Array:
    """`lax.pad` of the spatial `axes` of `x` by `(low, high)` `pairs` (negative entries crop)
    and `interior` zeros between neighbours (default none); other axes untouched."""
    config = [(0, 0, 0)] * x.ndim
    for j, a in enumerate(axes):
        config[a] = (*pairs[j], 0 if interior is None else interior[j])
    return lax.pad(x, jnp.zeros((), x.dtype), config)


def conv_transpose(
    x: jax.Array,
    kernel: jax.Array,
    *,
    stride: IntOrSeq,
    padding: IntOrSeq,
    output_padding: IntOrSeq,
    dilation: IntOrSeq,
    dimension_numbers: tuple[str, str, str],
    method: str = "auto",
    precision: Any = None,
    preferred_element_type: Any = None,
) -> jax.Array:
    """Transposed convolution with PyTorch semantics for stride/padding/output_padding/dilation
    (ints or per-dim tuples). `kernel` is in *correlation form*: already spatially flipped,
    I = input channels, O = output channels, exactly what flax.linen.ConvTranspose
    (transpose_kernel=False) and equinox.nn.ConvTranspose store. Every method returns the same
    values (up to float rounding).

    ``method``: one of :data:`METHODS` or ``"auto"`` (see :func:`choose_method`).
    """
    x, kernel = jnp.asarray(x), jnp.asarray(kernel)
    dn = _parse(x, kernel, dimension_numbers)
    n = x.ndim - 2
    lhs_sp, rhs_sp = dn.lhs_spec[2:], dn.rhs_spec[2:]
    ksize = tuple(kernel.shape[a] for a in rhs_sp)
    in_sp = tuple(x.shape[a] for a in lhs_sp)
    s = _tuple(stride, n, "stride")
    p = _tuple(padding, n, "padding")
    op = _tuple(output_padding, n, "output_padding")
    d = _tuple(dilation, n, "dilation")
    out_size = output_shape(in_sp, ksize, s, p, op, d)
    pads = torch_padding(ksize, s, p, op, d)

    if method == "auto":
        method = choose_method(x.shape, kernel.shape, s, d, jax.default_backend())
    conv = lambda lhs, rhs, padding, rhs_dilation, lhs_dilation=None: lax.conv_general_dilated(
        lhs,
        rhs,
        window_strides=(1,) * n,
        padding=padding,
        lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation,
        dimension_numbers=dn,
        precision=precision,
        preferred_element_type=preferred_element_type,
    )

    if method == "lhs_dilation":
        return conv(x, kernel, pads, d, lhs_dilation=s)
    if method == "pad":
        xp = _pad_spatial(x, lhs_sp, pads, [sj - 1 for sj in s])
        # Without the barrier XLA folds the interior padding back into the convolution as
        # lhs dilation, i.e. this method would compile to exactly "lhs_dilation".
        xp = lax.optimization_barrier(xp)
        return conv(xp, kernel, [(0, 0)] * n, d)
    if method == "phase":
        return _phase(x, kernel, dn, s, d, pads, out_size, conv)
    if method == "phase_batched":
        return _phase_batched(x, kernel, dn, s, d, pads, out_size, conv)
    if method == "im2col":

        def gemm(lhs: jax.Array, rhs: jax.Array, padding: Any, rhs_dilation: Any) -> jax.Array:
            if any(p != (0, 0) for p in padding):  # the formulations pad with lax.pad first
                raise ValueError(f"im2col computes VALID convolutions only, got {padding}")
            return im2col.conv(lhs, rhs, dn, rhs_dilation, precision=precision,
                               preferred_element_type=preferred_element_type)

        if any(sj > 1 for sj in s):
            return _phase_batched(x, kernel, dn, s, d, pads, out_size, gemm)
        # A negative pad crops (padding > d * (k - 1)).
        return gemm(_pad_spatial(x, lhs_sp, pads), kernel, [(0, 0)] * n, d)
    raise ValueError(f"unknown method {method!r}; expected one of {CHOICES}")


def _phase(
    x: jax.Array,
    kernel: jax.Array,
    dn: lax.ConvDimensionNumbers,
    s: tuple[int, ...],
    d: tuple[int, ...],
    pads: tuple[tuple[int, int], ...],
    out_size: tuple[int, ...],
    conv: Any,
) -> jax.Array:
    """Sub-pixel decomposition: one stride-1 convolution per output phase, then interleave."""
    n = len(s)
    lhs_sp, rhs_sp, out_sp = dn.lhs_spec[2:], dn.rhs_spec[2:], dn.out_spec[2:]
    ksize = tuple(kernel.shape[a] for a in rhs_sp)
    in_sp = tuple(x.shape[a] for a in lhs_sp)
    # Every phase computes ceil(L/s) outputs; rows past L are cropped after interleaving.
    m_out = tuple(-(-length // sj) for length, sj in zip(out_size, s, strict=True))

    results: list[jax.Array | None] = []
    for r in itertools.product(*(range(sj) for sj in s)):
        found = [_phase_taps(ksize[j], s[j], d[j], pads[j][0], r[j]) for j in range(n)]
        taps = [t for t in found if t is not None]
        if len(taps) < n:  # Some dim has no tap for this phase: its outputs are zero.
            results.append(None)
            continue
        index: list[slice] = [slice(None)] * kernel.ndim
        pairs, sub_dil = [], []
        for j, (t0, step, c0, dj) in enumerate(taps):
            index[rhs_sp[j]] = slice(t0, None, step)
            n_taps = len(range(t0, ksize[j], step))
            # out[m] = sum_n K'[n] x[m + c0 + n*dj] for m < m_out: pad low -c0, high to fit.
            pairs.append((-c0, m_out[j] - 1 + c0 + dj * (n_taps - 1) - (in_sp[j] - 1)))
            sub_dil.append(dj)
        # Explicit (possibly negative) lax.pad + VALID convolution: neither the convolution nor
        # its autodiff transposes get negative padding, which XLA CPU can compute wrongly.
        xr = _pad_spatial(x, lhs_sp, pairs)
        results.append(conv(xr, kernel[tuple(index)], [(0, 0)] * n, sub_dil))

    # In every dim some phase has taps (r = (lo - t*d) mod s for any t), so one phase is non-empty.
    ref = next(y for y in results if y is not None)
    stacked = jnp.stack([jnp.zeros_like(ref) if y is None else y for y in results])
    stacked = stacked.reshape(*s, *ref.shape)
    # Interleave: every spatial out axis a becomes (m, phase) and is merged into one axis.
    perm: list[int] = []
    for a in range(ref.ndim):
        perm.append(n + a)
        if a in out_sp:
            perm.append(out_sp.index(a))
    merged = [ref.shape[a] * (s[out_sp.index(a)] if a in out_sp else 1) for a in range(ref.ndim)]
    y = stacked.transpose(perm).reshape(merged)
    crop = [slice(None)] * y.ndim
    for j, a in enumerate(out_sp):
        crop[a] = slice(0, out_size[j])
    return y[tuple(crop)]


def _phase_windows(k: int, s: int, d: int, lo: int, in_len: int, m_out: int) -> tuple:
    """One dim of `phase_batched`. Every phase reads its taps from its own window of the input
    starting at its offset `c0`; all windows share one width, so one convolution computes every
    phase at every window start `q`, and phase r's output m is at `q = m + shift[r]`.

    Returns `(select, shift, pad_lo, pad_hi, n_q)`: `select[r, w, t]` = 1 where phase r reads
    kernel tap t at window position w; the input padding; the number of window starts."""
    phases = [_phase_taps(k, s, d, lo, r) for r in range(s)]
    used = [p for p in phases if p is not None]
    width = max(dj * (len(range(t0, k, step)) - 1) + 1 for t0, step, _, dj in used)
    base = min(c0 for _, _, c0, _ in used)
    select = np.zeros((s, width, k), np.float32)
    shift = [0] * s
    for r, found in enumerate(phases):
        if found is not None:
            t0, step, c0, dj = found
            shift[r] = c0 - base
            for i, t in enumerate(range(t0, k, step)):
                select[r, i * dj, t] = 1.0
    n_q = m_out + max(shift)
    return select, shift, -base, n_q - 1 + base + width - 1 - (in_len - 1), n_q


def _phase_batched(
    x: jax.Array,
    kernel: jax.Array,
    dn: lax.ConvDimensionNumbers,
    s: tuple[int, ...],
    d: tuple[int, ...],
    pads: tuple[tuple[int, int], ...],
    out_size: tuple[int, ...],
    conv: Any,
) -> jax.Array:
    """All phases in one VALID convolution with prod(s) * O output channels, then each phase's
    outputs sliced at its window shift and interleaved (depth-to-space). The kernel is assembled
    by contracting it with constant 0/1 selections, so gradients reach it as for any method."""
    n = len(s)
    lhs_sp, rhs_sp = dn.lhs_spec[2:], dn.rhs_spec[2:]
    in_sp = tuple(x.shape[a] for a in lhs_sp)
    ksize = tuple(kernel.shape[a] for a in rhs_sp)
    m_out = tuple(-(-length // sj) for length, sj in zip(out_size, s, strict=True))
    dims = [_phase_windows(ksize[j], s[j], d[j], pads[j][0], in_sp[j], m_out[j])
            for j in range(n)]
    # Kernel -> (O, I, *k), contract each spatial dim with its selection -> (*s, O, I, *window).
    k_oi = kernel.transpose(dn.rhs_spec)
    letters = "abcdefghijklmnopqrstuvwxyz"
    phase_l, win_l, tap_l = letters[:n], letters[n:2 * n], letters[2 * n:3 * n]
    spec = (f"OI{tap_l}," + ",".join(f"{phase_l[j]}{win_l[j]}{tap_l[j]}" for j in range(n))
            + f"->{phase_l}OI{win_l}")
    kb = jnp.einsum(spec, k_oi, *(jnp.asarray(dim[0], kernel.dtype) for dim in dims))
    o, i = k_oi.shape[:2]
    kb = kb.reshape(math.prod(s) * o, i, *kb.shape[n + 2:]).transpose(np.argsort(dn.rhs_spec))
    xp = _pad_spatial(x, lhs_sp, [(dim[2], dim[3]) for dim in dims])
    y = conv(xp, kb, [(0, 0)] * n, (1,) * n)  # out layout, channels = (*s, O) phase-major
    batch = y.shape[dn.out_spec[0]]
    # -> (N, *s, O, *q); per dim j, phase r keeps q = m + shift[r] for m < m_out.
    y = y.transpose(dn.out_spec).reshape(batch, *s, o, *(dim[4] for dim in dims))
    for j, (_, shift, _, _, _) in enumerate(dims):
        axis = 2 + n + j
        y = jnp.stack([lax.slice_in_dim(jnp.take(y, r, axis=1 + j), shift[r],
                                        shift[r] + m_out[j], axis=axis - 1)
                       for r in range(s[j])], axis=1 + j)
    # (N, *s, O, *m) -> (N, O, m_0, s_0, m_1, s_1, ...) -> (N, O, *(m * s)), cropped.
    perm = [0, n + 1, *itertools.chain.from_iterable((n + 2 + j, 1 + j) for j in range(n))]
    y = y.transpose(perm).reshape(batch, o, *(m * sj for m, sj in zip(m_out, s, strict=True)))
    y = y[(slice(None), slice(None), *(slice(0, length) for length in out_size))]
    return y.transpose(np.argsort(dn.out_spec))
