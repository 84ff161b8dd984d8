"""Every conv_transpose formulation equals PyTorch and the others: values and gradients."""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from zoo.layers.conv_transpose import (
    METHODS,
    choose_method,
    conv_transpose,
    output_shape,
    torch_padding,
)
from zoo.runtime import precision
from zoo.testing import assert_close

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
    "pad" is safe only because of its optimization barrier (XLA otherwise folds the interior
    padding back into lhs dilation: see FIXED[-1]); "phase" never dilates its input.
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


def _op(cfg: dict, method: str):
    """`(x, kernel) -> y` for one config and method."""
    return lambda a, b: conv_transpose(
        a,
        b,
        stride=cfg["s"],
        padding=cfg["p"],
        output_padding=cfg["op"],
        dilation=cfg["d"],
        dimension_numbers=layouts(cfg["n"], cfg["channels_last"]),
        method=method,
    )


def run_jax(x, kernel, ct, cfg, method):
    fn = _op(cfg, method)

    def fwd_bwd(a, b, c):
        y, vjp = jax.vjp(fn, a, b)
        return (y, *vjp(c))

    # One compiled program per example is ~2x faster than op-by-op dispatch here.
    return [np.asarray(t) for t in jax.jit(fwd_bwd)(x, kernel, ct)]


def _example(k, s, p, op, d, i, last=True) -> dict:
    return {
        "n": len(k),
        "k": k,
        "s": s,
        "p": p,
        "op": op,
        "d": d,
        "i": i,
        "batch": 2,
        "cin": 2,
        "cout": 2,
        "channels_last": last,
        "seed": 0,
    }


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(cfg=configs())
# Regressions: XLA CPU computed the kernel gradient of a convolution with mixed-sign padding
# wrongly here (before "phase" moved its padding into lax.pad); the second aborts XLA when
# compiled with lhs_dilation (and with "pad" before its optimization barrier).
@example(cfg=_example((2, 1), (3, 1), (1, 0), (2, 0), (2, 1), (2, 2), last=False))
@example(cfg=_example((3, 2, 3), (2, 2, 2), (0, 1, 1), (1, 0, 1), (1, 1, 1), (2, 5, 3)))
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
        assert_close(from_layout(y, last), yt, err_msg=f"{method} fwd")
        assert_close(from_layout(gx, last), gxt, err_msg=f"{method} dx")
        assert_close(kernel_to_torch_weight(gk, last), gwt, err_msg=f"{method} dkernel")
        results[method] = (y, gx, gk)
    for method in methods[1:]:
        for a, b in zip(results[method], results[methods[0]], strict=True):
            assert_close(a, b, err_msg=method)


FIXED = [
    # (n, k, s, p, op, d, i, channels_last); ints mean the same value in every dim
    (3, 4, 2, 1, 0, 1, (3, 4, 2), True),
    (2, 3, (2, 3), 2, (1, 0), 2, (5, 6), False),
    (2, 5, 3, 7, 2, 1, (4, 5), True),  # padding > d*(k-1)
    (1, 4, 2, 3, 1, 2, (7,), False),  # stride and dilation share a factor
    (1, 1, 3, 0, 0, 1, (4,), True),  # some phases have no taps
    (2, (3, 2), (1, 2), (0, 1), 0, 1, (2, 5), True),  # aborts XLA with lhs_dilation
]


def _cfg(case) -> dict:
    n, k, s, p, op, d, i, last = case
    t = lambda v: (v,) * n if isinstance(v, int) else tuple(v)
    return {
        "n": n,
        "k": t(k),
        "s": t(s),
        "p": t(p),
        "op": t(op),
        "d": t(d),
        "i": i,
        "channels_last": last,
    }


@functools.cache
def _fixed(case, dtype_name: str, method: str, jit: bool = False) -> tuple[np.ndarray, ...]:
    """Output, d/dx and d/dkernel of sum(y**2), as float32 numpy."""
    cfg = _cfg(case)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, *cfg["i"]), dtype=np.float32)
    w = rng.standard_normal((3, 2, *cfg["k"]), dtype=np.float32)
    fn = _op(cfg, method)
    last = cfg["channels_last"]
    args = (
        jnp.asarray(to_layout(x, last), dtype_name),
        jnp.asarray(torch_weight_to_kernel(w, last), dtype_name),
    )
    loss = lambda a, b: jnp.sum(fn(a, b).astype(jnp.float32) ** 2)
    both = lambda a, b: (fn(a, b), *jax.grad(loss, (0, 1))(a, b))
    if jit:
        both = jax.jit(both)
    return tuple(np.asarray(t, np.float32) for t in both(*args))


def _methods(case) -> list[str]:
    return [m for m in METHODS if m != "lhs_dilation" or not xla_operand_swap_hazard(_cfg(case))]


@pytest.mark.parametrize("case", FIXED)
def test_jit_matches_eager(case):
    methods = _methods(case)
    for method in methods:
        for a, b in zip(
            _fixed(case, "float32", method, jit=True),
            _fixed(case, "float32", methods[0]),
            strict=True,
        ):
            assert_close(a, b, err_msg=method)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", FIXED[:2])
def test_low_precision(case, dtype):
    ref = _fixed(case, "float32", "pad", jit=True)
    rel = precision.tolerance(dtype, kind="max_relative")
    for method in METHODS:
        got = _fixed(case, dtype, method, jit=True)
        for a, b, what in zip(got, ref, ("y", "dx", "dk"), strict=True):
            assert np.isfinite(a).all()
            err = np.max(np.abs(a - b)) / np.max(np.abs(b))
            assert err < rel, (method, what, err)


def test_output_dtype_and_preferred_element_type():
    x = jax.ShapeDtypeStruct((1, 4, 4, 2), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((3, 3, 2, 5), jnp.bfloat16)
    kw = dict(
        stride=2,
        padding=1,
        output_padding=1,
        dilation=1,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    for method in (*METHODS, "auto"):
        y = jax.eval_shape(lambda a, b, m=method: conv_transpose(a, b, method=m, **kw), x, k)
        assert y.dtype == jnp.bfloat16 and y.shape == (1, 8, 8, 5)
        f = lambda a, b, m=method: conv_transpose(
            a, b, method=m, preferred_element_type=jnp.float32, **kw
        )
        y = jax.eval_shape(f, x, k)
        assert y.dtype == jnp.float32 and y.shape == (1, 8, 8, 5)


HLO_METHODS = ("pad", "phase", "phase_batched", "im2col")


def compiled_programs() -> dict[str, list[str]]:
    """`"method-case"` -> the compiled HLO of the forward op and of both gradients, for every
    fixed case and method (`compiled_windows` runs it in a fresh interpreter)."""
    programs = {}
    for (i, case), method in itertools.product(enumerate(FIXED), HLO_METHODS):
        cfg = _cfg(case)
        x = jnp.zeros((2, *cfg["i"], 3) if cfg["channels_last"] else (2, 3, *cfg["i"]))
        k = jnp.zeros((*cfg["k"], 3, 2) if cfg["channels_last"] else (2, 3, *cfg["k"]))
        fn = _op(cfg, method)
        grad = jax.grad(lambda a, b, fn=fn: jnp.sum(fn(a, b) ** 2), (0, 1))
        programs[f"{method}-{i}"] = [jax.jit(f).lower(x, k).compile().as_text()
                                     for f in (fn, grad)]
    return programs


@pytest.fixture(scope="module")
def compiled_hlo() -> dict[str, list[str]]:
    """`compiled_programs` as a user's process compiles them: the suite's elemental emitter
    (tests/conftest.py) takes another path through XLA:CPU's pipeline, where the "pad"
    method's gradients keep an lhs-dilated convolution, so the programs compile in a fresh
    interpreter with XLA's default emitters (most optimisations still off, as the suite)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_cpu_use_fusion_emitters")]
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    code = ("import json, tests.test_conv_transpose_methods as t; "
            "print(json.dumps(t.compiled_programs()))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.cpu_only(reason="reads XLA:CPU's compiled HLO for two XLA:CPU defects; GPUs "
                       "compile convolutions to library calls")
@pytest.mark.parametrize("case", range(len(FIXED)))
@pytest.mark.parametrize("method", HLO_METHODS)
@pytest.mark.pinned("jax", "jaxlib")
def test_compiled_convolutions_have_no_lhs_dilation_or_negative_padding(case, method,
                                                                        compiled_hlo):
    """What XLA compiles for "pad"/"phase" (forward and both gradients) avoids the two XLA CPU
    defects met here: lhs dilation (operand-swap abort) and negative convolution padding
    (wrong values)."""
    for hlo in compiled_hlo[f"{method}-{case}"]:
        for window in re.findall(r"convolution\(.*?window=\{([^}]*)\}", hlo):  # k=1: dots
            assert "lhs_dilate" not in window, window
            pads = re.search(r"pad=(\S+)", window)
            assert pads is None or "-" not in pads.group(1), window
        if method == "im2col":  # matrix multiplies only
            assert "convolution(" not in hlo


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
        assert_close(y, ys[0])


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


@pytest.mark.parametrize("case", [FIXED[0], FIXED[-1]])
def test_auto_is_chosen_method(case):
    """`auto` lowers to exactly the program of the method it chooses (forward and gradients):
    the same program on every backend, not just equal numbers on one."""
    cfg = _cfg(case)
    x = jnp.zeros((2, *cfg["i"], 3) if cfg["channels_last"] else (2, 3, *cfg["i"]))
    k = jnp.zeros((*cfg["k"], 3, 2) if cfg["channels_last"] else (2, 3, *cfg["k"]))
    chosen = choose_method(x.shape, k.shape, cfg["s"], cfg["d"], jax.default_backend())
    assert chosen in _methods(case)

    def program(method: str) -> str:
        fn = _op(cfg, method)
        both = lambda a, b: (fn(a, b), jax.grad(lambda a, b: jnp.sum(fn(a, b) ** 2), (0, 1))(a, b))
        return jax.jit(both).lower(x, k).as_text()

    assert program("auto") == program(chosen)
    assert program("auto") != program(next(m for m in METHODS if m != chosen))


def test_choose_method_grid():
    for n, s, d, backend in itertools.product((1, 2, 3), (1, 2, 3), (1, 2), ("cpu", "gpu", "tpu")):
        x_shape, k_shape = (2, *(9,) * n, 8), (*(4,) * n, 8, 16)
        for stride in {(s,) * n, (1,) * (n - 1) + (s,)}:
            method = choose_method(x_shape, k_shape, stride, (d,) * n, backend)
            if backend == "cpu" and n == 3:
                want = "im2col"
            elif all(v == 1 for v in stride):
                want = "lhs_dilation"
            else:
                want = "phase_batched" if backend == "cpu" else "phase"
            assert method == want, (n, stride, backend)
