"""zoo.layers.conv: 3-D convolutions as im2col + GEMM on the CPU, equal to XLA's convolution
forward and backward in every layout; every other convolution left to XLA; the Equinox `Conv`
equal to `eqx.nn.Conv`."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import canonical
from zoo.layers import im2col
from zoo.layers.conv import conv_general_dilated, uses_im2col
from zoo.layers.eqx import Conv, Conv3d

CASES = {  # (lhs layout, rhs layout, kernel, padding, dilation)
    "channels-last-pad1": ("NDHWC", "DHWIO", (3, 3, 3), ((1, 1),) * 3, (1, 1, 1)),
    "channels-first-same": ("NCDHW", "OIDHW", (3, 2, 3), "SAME", (1, 1, 1)),
    "asymmetric-dilated": ("NDHWC", "DHWIO", (3, 3, 2), ((2, 0), (1, 2), (0, 1)), (2, 1, 2)),
    "pointwise": ("NDHWC", "DHWIO", (1, 1, 1), "VALID", (1, 1, 1)),
    # padding beyond the kernel's reach: the input gradient crops the cotangent
    "padded-past-reach": ("NCDHW", "OIDHW", (1, 2, 3), ((1, 2), (2, 0), (0, 3)), (1, 1, 1)),
}


def _operands(lhs_spec: str, rhs_spec: str, kernel: tuple[int, ...]):
    sizes = {"N": 2, "C": 3, "D": 6, "H": 5, "W": 7}
    x = jax.random.normal(jax.random.key(0), [sizes[a] for a in lhs_spec])
    ksizes = {"I": 3, "O": 4, **dict(zip("DHW", kernel, strict=True))}
    w = jax.random.normal(jax.random.key(1), [ksizes[a] for a in rhs_spec])
    return x, w


@pytest.mark.parametrize("slab_bytes", [0, 4_000, 50_000, None],
                         ids=["row", "rows", "slabs", "whole"])
@pytest.mark.parametrize("case", CASES)
def test_equals_xla_forward_and_both_gradients(case, slab_bytes, monkeypatch):
    """Every case with one row of one output slice per loop step, a few rows, a few slices per
    step, and (the default budget at these sizes) the whole volume in one step."""
    if slab_bytes is not None:
        monkeypatch.setattr(im2col, "SLAB_BYTES", slab_bytes)
    lhs_spec, rhs_spec, kernel, padding, dilation = CASES[case]
    x, w = _operands(lhs_spec, rhs_spec, kernel)
    dn = (lhs_spec, rhs_spec, lhs_spec)

    def loss(conv, x, w):
        y = conv(x, w, (1, 1, 1), padding, rhs_dilation=dilation, dimension_numbers=dn,
                 precision=lax.Precision.HIGHEST)
        return jnp.sum(jnp.sin(y)), y

    (_, want), want_grads = jax.jit(jax.value_and_grad(
        lambda x, w: loss(lax.conv_general_dilated, x, w), (0, 1), has_aux=True))(x, w)
    (_, got), got_grads = jax.jit(jax.value_and_grad(
        lambda x, w: loss(conv_general_dilated, x, w), (0, 1), has_aux=True))(x, w)
    assert got.shape == want.shape
    for a, b in zip((got, *got_grads), (want, *want_grads), strict=True):
        # float32 sums in another order: within 1e-5 of the largest value
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), case


def test_block_is_the_largest_divisor_within_the_budget(monkeypatch):
    """Per loop step: output slices, a divisor of the first output axis, as many as the patch
    budget holds; a slice over the budget is cut into blocks of rows of the second axis (a
    divisor, at least one)."""
    x = jnp.zeros((2, 14, 6, 7, 3))  # patches of one slice, k 3x3x3: 2*4*5*27*3*4 = 12960 B
    per_slice = 2 * 4 * 5 * 27 * 3 * 4
    for budget, want in [(0, (1, 1)), (per_slice // 4, (1, 1)), (per_slice // 2, (1, 2)),
                         (per_slice * 3 // 4, (1, 2)), (per_slice, (1, 4)),
                         (5 * per_slice, (4, 4)), (13 * per_slice, (12, 4)),
                         (100 * per_slice, (12, 4))]:
        monkeypatch.setattr(im2col, "SLAB_BYTES", budget)
        assert im2col._block(x, (3, 3, 3), (12, 4, 5), False) == want, budget


@pytest.mark.cpu_only(reason="the im2col formulation is chosen for XLA:CPU")
def test_a_3d_convolution_compiles_without_an_xla_convolution_on_the_cpu():
    x, w = _operands("NDHWC", "DHWIO", (3, 3, 3))
    dn = ("NDHWC", "DHWIO", "NDHWC")

    def hlo(conv):
        fn = jax.grad(lambda x, w: jnp.sum(conv(x, w, (1, 1, 1), "SAME", dimension_numbers=dn)),
                      (0, 1))
        return jax.jit(fn).lower(x, w).compile().as_text()

    assert " convolution(" in hlo(lax.conv_general_dilated)
    assert " convolution(" not in hlo(conv_general_dilated)


@pytest.mark.parametrize("n_spatial,strides,lhs_dilation,groups,backend,expected", [
    (3, (1, 1, 1), None, 1, "cpu", True),
    (4, (1,) * 4, (1,) * 4, 1, "cpu", True),
    (2, (1, 1), None, 1, "cpu", False),        # XLA's 2-D convolution is the faster
    (3, (2, 2, 2), None, 1, "cpu", False),     # strided: XLA's
    (3, (1, 1, 1), (2, 2, 2), 1, "cpu", False),
    (3, (1, 1, 1), None, 2, "cpu", False),     # grouped
    (3, (1, 1, 1), None, 1, "gpu", False),
])
def test_which_convolutions_use_im2col(n_spatial, strides, lhs_dilation, groups, backend,
                                       expected):
    assert uses_im2col(n_spatial, strides, lhs_dilation, groups, 1, backend) is expected


def test_other_convolutions_are_xlas_own():
    x = jax.random.normal(jax.random.key(0), (2, 9, 9, 3))
    w = jax.random.normal(jax.random.key(1), (3, 3, 3, 4))
    dn = ("NHWC", "HWIO", "NHWC")
    for strides in ((1, 1), (2, 2)):
        got = jax.jit(lambda x, w, s=strides: conv_general_dilated(
            x, w, s, "SAME", dimension_numbers=dn)).lower(x, w).as_text()
        assert "stablehlo.convolution" in got


def test_equinox_conv_equals_equinox_and_keeps_its_kind():
    ref = eqx.nn.Conv3d(3, 4, (3, 3, 3), padding=1, dilation=(1, 2, 1), key=jax.random.key(0))
    ours = Conv3d(3, 4, (3, 3, 3), padding=1, dilation=(1, 2, 1), key=jax.random.key(0))
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(a, b)  # same initialisation and layout
    x = jax.random.normal(jax.random.key(2), (2, 3, 6, 7, 5))
    got, want = jax.vmap(ours)(x), jax.vmap(ref)(x)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    assert isinstance(ours, Conv) and isinstance(ours, eqx.nn.Conv)
    assert canonical.kind_of(ours, "eqx") is canonical.kind_of(ref, "eqx") is not None
    with pytest.raises(ValueError, match=r"Conv expects rank 4 input, got shape \(3, 6, 7\)"):
        ours(x[0, :, :, :, 0])
