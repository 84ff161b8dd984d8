"""Every conv_transpose formulation equals PyTorch and the others: values and gradients."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from zoo.layers.conv_transpose import (
    METHODS,
    choose_method,
    conv_transpose,
    output_shape,
    torch_padding,
)

TOL = {"rtol": 1e-5, "atol": 1e-5}
SPATIAL = {1: "W", 2: "HW", 3: "DHW"}


def layouts(n: int, channels_last: bool) -> tuple[str, str, str]:
    sp = SPATIAL[n]
    if channels_last:
        return ("N" + sp + "C", sp + "IO", "N" + sp + "C")
    return ("NC" + sp, "OI" + sp, "NC" + sp)


def to_layout(a: np.ndarray, channels_last: bool) -> np.ndarray:
    """(N, C, *sp) -> layout's data order."""
    return np.moveaxis(a, 1, -1) if channels_last else a


def from_layout(a: np.ndarray, channels_last: bool) -> np.ndarray:
    return np.moveaxis(a, -1, 1) if channels_last else a


def torch_weight_to_kernel(w: np.ndarray, channels_last: bool) -> np.ndarray:
    """PyTorch weight (I, O, *k) -> correlation-form kernel (*k, I, O) or (O, I, *k)."""
    n = w.ndim - 2
    flipped = np.flip(w, tuple(range(2, 2 + n)))
    if channels_last:
        return np.ascontiguousarray(flipped.transpose(*range(2, 2 + n), 0, 1))
    return np.ascontiguousarray(flipped.swapaxes(0, 1))


def kernel_to_torch_weight(k: np.ndarray, channels_last: bool) -> np.ndarray:
    n = k.ndim - 2
    w = np.moveaxis(k, (n, n + 1), (0, 1)) if channels_last else k.swapaxes(0, 1)
    return np.flip(w, tuple(range(2, 2 + n)))


def xla_operand_swap_hazard(cfg: dict) -> bool:
    """True where XLA may abort the process compiling the "lhs_dilation" formulation.

    XLA's convolution operand swap (algebraic simplifier, jaxlib 0.10.2 on CPU) treats a window
    dim with zero padding, base (lhs) dilation == window size and window stride == size - 1 as a
    "group" dim and copies it unchanged into the swapped window, producing an invalid convolution
    ("Window dimensions do not match RHS shape", a CHECK failure, not a Python error). With
    lhs_dilation = s >= 2 that needs zero padding: p == d*(k-1) and op == 0 (e.g. k2 s2 p1,
    forward; the kernel-gradient convolution too). Flax and Equinox ConvTranspose share it.
    The other formulations have no lhs dilation and are safe.
    """
    return any(
        s >= 2 and p == d * (k - 1) and op == 0
        for k, s, p, op, d in zip(cfg["k"], cfg["s"], cfg["p"], cfg["op"], cfg["d"], strict=True)
    )


@st.composite
def configs(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 3))
    k, s, p, op, d, i = [], [], [], [], [], []
    for _ in range(n):
        kj, sj, dj = draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
        big = draw(st.integers(0, 9)) == 0  # occasionally padding beyond d*(k-1)
        pj = draw(st.integers(0, dj * (kj - 1) + (2 if big else 0)))
        opj = draw(st.integers(0, max(sj, dj) - 1))
        ij = draw(st.integers(1, 7))
        k.append(kj), s.append(sj), p.append(pj), op.append(opj), d.append(dj), i.append(ij)
    assume(
        all(
            o >= 1
            for o in (
                (a - 1) * b - 2 * c + e * (f - 1) + g + 1
                for a, b, c, e, f, g in zip(i, s, p, d, k, op, strict=True)
            )
        )
    )
    return {
        "n": n,
        "k": tuple(k),
        "s": tuple(s),
        "p": tuple(p),
        "op": tuple(op),
        "d": tuple(d),
        "i": tuple(i),
        "batch": draw(st.integers(1, 2)),
        "cin": draw(st.integers(1, 3)),
        "cout": draw(st.integers(1, 3)),
        "channels_last": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def run_torch(x, w, ct, cfg):
    torch = pytest.importorskip("torch")
    fn = getattr(torch.nn.functional, f"conv_transpose{cfg['n']}d")
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(np.ascontiguousarray(w), requires_grad=True)
    yt = fn(xt, wt, stride=cfg["s"], padding=cfg["p"], output_padding=cfg["op"], dilation=cfg["d"])
    yt.backward(torch.tensor(ct))
    return yt.detach().numpy(), xt.grad.numpy(), wt.grad.numpy()


def run_jax(x, kernel, ct, cfg, method):
    fn = lambda a, b: conv_transpose(
        a,
        b,
        stride=cfg["s"],
        padding=cfg["p"],
        output_padding=cfg["op"],
        dilation=cfg["d"],
        dimension_numbers=layouts(cfg["n"], cfg["channels_last"]),
        method=method,
    )

    def fwd_bwd(a, b, c):
        y, vjp = jax.vjp(fn, a, b)
        return (y, *vjp(c))

    # One compiled program per example is ~2x faster than op-by-op dispatch here.
    return [np.asarray(t) for t in jax.jit(fwd_bwd)(x, kernel, ct)]


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(cfg=configs())
def test_methods_match_torch_and_each_other(cfg):
    pytest.importorskip("torch")
    rng = np.random.default_rng(cfg["seed"])
    last = cfg["channels_last"]
    x = rng.standard_normal((cfg["batch"], cfg["cin"], *cfg["i"]), dtype=np.float32)
    w = rng.standard_normal((cfg["cin"], cfg["cout"], *cfg["k"]), dtype=np.float32)
    out = output_shape(cfg["i"], cfg["k"], cfg["s"], cfg["p"], cfg["op"], cfg["d"])
    ct = rng.standard_normal((cfg["batch"], cfg["cout"], *out), dtype=np.float32)
    yt, gxt, gwt = run_torch(x, w, ct, cfg)
    kernel = torch_weight_to_kernel(w, last)
    results = {}
    skip = {"lhs_dilation"} if xla_operand_swap_hazard(cfg) else set()
    methods = [m for m in METHODS if m not in skip]
    for method in methods:
        y, gx, gk = run_jax(to_layout(x, last), kernel, to_layout(ct, last), cfg, method)
        assert y.shape == to_layout(yt, last).shape, method
        np.testing.assert_allclose(from_layout(y, last), yt, **TOL, err_msg=f"{method} fwd")
        np.testing.assert_allclose(from_layout(gx, last), gxt, **TOL, err_msg=f"{method} dx")
        np.testing.assert_allclose(
            kernel_to_torch_weight(gk, last), gwt, **TOL, err_msg=f"{method} dkernel"
        )
        results[method] = (y, gx, gk)
    for method in methods[1:]:
        for a, b in zip(results[method], results[methods[0]], strict=True):
            np.testing.assert_allclose(a, b, **TOL, err_msg=method)


FIXED = [
    # (n, k, s, p, op, d, i, channels_last)
    (3, 4, 2, 1, 0, 1, (3, 4, 5), True),
    (3, 3, 2, 1, 1, 1, (4, 3, 2), False),
    (2, 3, (2, 3), 2, (1, 0), 2, (5, 6), True),
    (2, 5, 3, 7, 2, 1, (4, 5), True),  # padding > d*(k-1)
    (1, 4, 2, 3, 1, 2, (7,), False),  # stride and dilation share a factor
    (1, 1, 3, 0, 0, 1, (4,), True),  # some phases have no taps
]


def _fixed(case, dtype, method, jit=False):
    n, k, s, p, op, d, i, last = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, *i), dtype=np.float32)
    w = rng.standard_normal((3, 2, *((k,) * n)), dtype=np.float32)
    fn = lambda a, b: conv_transpose(
        a,
        b,
        stride=s,
        padding=p,
        output_padding=op,
        dilation=d,
        dimension_numbers=layouts(n, last),
        method=method,
    )
    if jit:
        fn = jax.jit(fn)
    args = (
        jnp.asarray(to_layout(x, last), dtype),
        jnp.asarray(torch_weight_to_kernel(w, last), dtype),
    )
    y = fn(*args)
    gx, gk = jax.grad(lambda a, b: jnp.sum(fn(a, b).astype(jnp.float32) ** 2), (0, 1))(*args)
    return [np.asarray(t, np.float32) for t in (y, gx, gk)]


@pytest.mark.parametrize("case", FIXED)
@pytest.mark.parametrize("method", METHODS)
def test_jit_matches_eager(case, method):
    ref = _fixed(case, jnp.float32, "lhs_dilation")
    for a, b in zip(_fixed(case, jnp.float32, method, jit=True), ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("case", FIXED[:3])
def test_low_precision(case, dtype):
    ref = _fixed(case, jnp.float32, "lhs_dilation")
    rel = 2e-2 if dtype == jnp.bfloat16 else 4e-3
    for method in METHODS:
        got = _fixed(case, dtype, method, jit=True)
        for a, b, what in zip(got, ref, ("y", "dx", "dk"), strict=True):
            assert a.dtype == np.float32 and np.isfinite(a).all()
            err = np.max(np.abs(a - b)) / np.max(np.abs(b))
            assert err < rel, (method, what, err)


def test_output_dtype_and_preferred_element_type():
    x = jnp.ones((1, 4, 4, 2), jnp.bfloat16)
    k = jnp.ones((3, 3, 2, 5), jnp.bfloat16)
    kw = dict(
        stride=2,
        padding=1,
        output_padding=1,
        dilation=1,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    for method in METHODS:
        assert conv_transpose(x, k, method=method, **kw).dtype == jnp.bfloat16
        y = conv_transpose(x, k, method=method, preferred_element_type=jnp.float32, **kw)
        assert y.dtype == jnp.float32 and y.shape == (1, 8, 8, 5)


def test_mixed_layout_letters():
    """Spatial axes are matched by letter, as in lax (kernel 'OIWH' vs data 'NCHW')."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((1, 2, 5, 4), dtype=np.float32))
    k = jnp.asarray(rng.standard_normal((3, 2, 4, 2), dtype=np.float32))  # O I W H
    kw = dict(
        stride=(2, 3),
        padding=(1, 0),
        output_padding=(1, 2),
        dilation=1,
        dimension_numbers=("NCHW", "OIWH", "NCHW"),
    )
    ys = [conv_transpose(x, k, method=m, **kw) for m in METHODS]
    for y in ys[1:]:
        np.testing.assert_allclose(y, ys[0], **TOL)


def test_torch_padding():
    assert torch_padding((4, 4, 4), (2, 2, 2), (1, 1, 1), (0, 0, 0), (1, 1, 1)) == ((2, 2),) * 3
    assert torch_padding((3,), (2,), (1,), (1,), (1,)) == ((1, 2),)
    assert torch_padding((3, 5), (1, 3), (0, 9), (0, 2), (2, 1)) == ((4, 4), (-5, -3))
    with pytest.raises(ValueError, match="output_padding must be smaller"):
        torch_padding((3,), (2,), (1,), (2,), (1,))
    with pytest.raises(ValueError, match="one per spatial dim"):
        torch_padding((3, 3), (2,), (1,), (0,), (1,))


def test_output_shape():
    assert output_shape((8, 8, 8), (4,) * 3, (2,) * 3, (1,) * 3, (0,) * 3, (1,) * 3) == (16,) * 3
    assert output_shape((32,), (3,), (2,), (1,), (1,), (1,)) == (64,)
    assert output_shape((5, 2), (2, 3), (1, 3), (0, 1), (0, 2), (2, 1)) == (7, 6)
    with pytest.raises(ValueError, match="not positive"):
        output_shape((1,), (1,), (1,), (1,), (0,), (1,))
    with pytest.raises(ValueError, match=r"output_padding must be smaller than stride or dilation"):
        output_shape((4,), (3,), (1,), (0,), (1,), (1,))
    with pytest.raises(ValueError, match="stride entries must be >= 1"):
        output_shape((4,), (3,), (0,), (0,), (0,), (1,))
    # output_padding < dilation is allowed even with stride 1 (PyTorch's rule).
    assert output_shape((4,), (3,), (1,), (0,), (1,), (2,)) == (9,)


def test_errors():
    x = jnp.ones((1, 5, 5, 3))
    k = jnp.ones((3, 3, 3, 4))
    kw = dict(
        stride=2,
        padding=1,
        output_padding=0,
        dilation=1,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    with pytest.raises(ValueError, match="unknown method 'fft'"):
        conv_transpose(x, k, method="fft", **kw)
    with pytest.raises(ValueError, match=r"channel mismatch.*\(1, 5, 5, 2\).*expects 3"):
        conv_transpose(jnp.ones((1, 5, 5, 2)), k, **kw)
    with pytest.raises(ValueError, match=r"x must have rank 4.*found shape \(5, 5, 3\)"):
        conv_transpose(jnp.ones((5, 5, 3)), k, **kw)
    with pytest.raises(ValueError, match=r"kernel must have rank 4.*found shape \(3, 3, 4\)"):
        conv_transpose(x, jnp.ones((3, 3, 4)), **kw)
    with pytest.raises(ValueError, match="stride must be an int or have 2 entries"):
        conv_transpose(x, k, **{**kw, "stride": (2, 2, 2)})
    with pytest.raises(ValueError, match="dimension_numbers"):
        conv_transpose(x, k, **{**kw, "dimension_numbers": ("NHWC", "HWIO")})
    with pytest.raises(ValueError, match="output_padding must be smaller"):
        conv_transpose(x, k, **{**kw, "output_padding": 2})


@pytest.mark.parametrize("case", FIXED[:2])
def test_auto_is_chosen_method(case):
    n, k, s, _, _, d, i, last = case
    x_shape = (2, *i, 3) if last else (2, 3, *i)
    k_shape = (*(k,) * n, 3, 2) if last else (2, 3, *(k,) * n)
    st_, dil = (s,) * n if isinstance(s, int) else s, (d,) * n if isinstance(d, int) else d
    chosen = choose_method(x_shape, k_shape, st_, dil, jax.default_backend())
    for a, b in zip(
        _fixed(case, jnp.float32, "auto"), _fixed(case, jnp.float32, chosen), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_choose_method_grid():
    for n, s, d, backend in itertools.product((1, 2, 3), (1, 2, 3), (1, 2), ("cpu", "gpu", "tpu")):
        x_shape, k_shape = (2, *(9,) * n, 8), (*(4,) * n, 8, 16)
        for stride in {(s,) * n, (1,) * (n - 1) + (s,)}:
            method = choose_method(x_shape, k_shape, stride, (d,) * n, backend)
            assert method in METHODS
            if all(v == 1 for v in stride):
                assert method == "lhs_dilation"
