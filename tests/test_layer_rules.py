"""Property tests of the per-layer conversion rules against PyTorch (docs/conventions.md).

For random Conv / ConvTranspose hyper-parameters (kernel 1-5, stride 1-3, padding, output padding
< stride, dilation 1-2, odd and non-cubic sizes, 1-3 spatial dims), a PyTorch layer's weights are
converted with the layer kinds' rules (`canonical.KINDS`) into the Equinox, Linen and NNX layers
(and the zoo's own conv-transpose layers, every method) and all outputs must equal PyTorch's.
"""

from __future__ import annotations

import zlib

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from canonical import KINDS, Layer
from canonical.torch_arrays import torch_to_numpy
from tests.conftest import examples
from tests.test_conv_transpose_methods import xla_operand_swap_hazard
from zoo.layers import eqx as zeqx
from zoo.layers import linen as zlinen
from zoo.layers import nnx as znnx
from zoo.layers.conv_transpose import METHODS, torch_padding
from zoo.testing import assert_close

torch = pytest.importorskip("torch")
SETTINGS = settings(max_examples=examples(20), deadline=None, derandomize=True)


def to_native(family, canon, layer):
    return KINDS[layer.kind].convert(family, canon, layer, to="native")


def to_canonical(family, native, layer):
    return KINDS[layer.kind].convert(family, native, layer, to="canonical")


@st.composite
def conv_cases(draw, transpose: bool):
    n = draw(st.integers(1, 3))
    k = tuple(draw(st.integers(1, 5)) for _ in range(n))
    s = tuple(draw(st.integers(1, 3)) for _ in range(n))
    d = tuple(draw(st.integers(1, 2)) for _ in range(n))
    p = tuple(draw(st.integers(0, di * (ki - 1))) for ki, di in zip(k, d, strict=True))
    # output_padding < stride (PyTorch allows < max(stride, dilation); Equinox only < stride).
    op = tuple(draw(st.integers(0, si - 1)) for si in s) if transpose else (0,) * n
    # Input sizes: odd and non-cubic, large enough that the output is not empty.
    if transpose:  # (i-1)s - 2p + d(k-1) + op + 1 >= 1
        low = [1 + max(0, -(-(2 * pi - di * (ki - 1) - oi) // si))
               for ki, si, di, pi, oi in zip(k, s, d, p, op, strict=True)]
    else:  # i + 2p - d(k-1) >= 1
        low = [max(1, di * (ki - 1) + 1 - 2 * pi) for ki, di, pi in zip(k, d, p, strict=True)]
    size = tuple(draw(st.integers(lo, lo + 4)) for lo in low)
    groups = 1 if transpose else draw(st.integers(1, 3))  # grouped weights: (O, I / groups, *k)
    channels = (groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3)))
    return dict(n=n, k=k, s=s, d=d, p=p, op=op, size=size, cin=channels[0], cout=channels[1],
                bias=draw(st.booleans()), groups=groups)


def _torch_layer(c, transpose):
    cls = {(1, False): torch.nn.Conv1d, (2, False): torch.nn.Conv2d, (3, False): torch.nn.Conv3d,
           (1, True): torch.nn.ConvTranspose1d, (2, True): torch.nn.ConvTranspose2d,
           (3, True): torch.nn.ConvTranspose3d}[c["n"], transpose]
    extra = {"output_padding": c["op"]} if transpose else {"groups": c["groups"]}
    torch.manual_seed(0)
    return cls(c["cin"], c["cout"], c["k"], stride=c["s"], padding=c["p"], dilation=c["d"],
               bias=c["bias"], **extra)


def _reference(c, transpose):
    layer = _torch_layer(c, transpose)
    x = torch.randn(2, c["cin"], *c["size"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = layer(x)
    canon = {k: torch_to_numpy(v) for k, v in layer.state_dict().items()}
    kind = "conv_transpose" if transpose else "conv"
    return x.numpy(), y.numpy(), canon, Layer("layer", kind)


def _channels_last(a):
    return np.moveaxis(a, 1, -1)


def _eqx_apply(layer, native, x):
    names = list(native)
    layer = eqx.tree_at(lambda m: [getattr(m, k) for k in names], layer,
                        [jnp.asarray(native[k]) for k in names])
    # compiled: one program per example rather than one per operation
    return np.asarray(eqx.filter_jit(lambda m, x: jax.vmap(m)(x))(layer, jnp.asarray(x)))


def _nnx_apply(layer, native, x):
    for k, v in native.items():
        getattr(layer, k).set_value(jnp.asarray(v))
    out = nnx.jit(lambda m, x: m(x))(layer, jnp.asarray(_channels_last(x)))  # as Equinox's
    return np.moveaxis(np.asarray(out), -1, 1)


def _linen_apply(module, native, x):
    out = jax.jit(module.apply)({"params": native}, _channels_last(x))
    return np.moveaxis(np.asarray(out), -1, 1)


@settings(SETTINGS, max_examples=examples(12))
@given(conv_cases(transpose=False))
def test_conv_rule_matches_torch(c):
    _check_conv_rule(c)


@pytest.mark.parametrize("groups", [2, 4])
def test_grouped_conv_rule_matches_torch(groups):
    """ResNeXt's grouped 3x3 (weights (O, I / groups, k, k)) in every library, a fixed case."""
    _check_conv_rule(dict(n=2, k=(3, 3), s=(2, 1), d=(1, 1), p=(1, 1), op=(0, 0), size=(7, 6),
                          cin=2 * groups, cout=3 * groups, bias=False, groups=groups))


@pytest.mark.parametrize(("multiplier", "k", "s"), [(1, (3, 3), (2, 2)), (1, (5, 5), (1, 2)),
                                                 (2, (3, 3), (1, 1)), (1, (7, 7), (1, 1))])
def test_depthwise_conv_rule_matches_torch(multiplier, k, s):
    """A depthwise conv (groups = in_channels: weights (O, 1, k, k), EfficientNet's and
    MobileNetV3's conv_dw, ConvNeXt's 7x7; `multiplier` outputs per channel) is the `conv`
    kind, in every library, with a bias (the canonical init draws it from fan_in = k*k, as
    PyTorch)."""
    _check_conv_rule(dict(n=2, k=k, s=s, d=(1, 1), p=(k[0] // 2, k[1] // 2), op=(0, 0),
                          size=(9, 8), cin=6, cout=6 * multiplier, bias=True, groups=6))


def _check_conv_rule(c):
    x, y, canon, spec = _reference(c, transpose=False)
    key, n, pairs = jax.random.key(0), c["n"], [(p, p) for p in c["p"]]
    eqx_layer = eqx.nn.Conv(n, c["cin"], c["cout"], c["k"], c["s"], c["p"], c["d"],
                            groups=c["groups"], use_bias=c["bias"], key=key)
    flax_args = dict(strides=c["s"], padding=pairs, kernel_dilation=c["d"], use_bias=c["bias"],
                     feature_group_count=c["groups"])
    outputs = {
        "eqx": _eqx_apply(eqx_layer, to_native("eqx", canon, spec), x),
        "linen": _linen_apply(nn.Conv(c["cout"], c["k"], **flax_args),
                              to_native("flax", canon, spec), x),
        "nnx": _nnx_apply(nnx.Conv(c["cin"], c["cout"], c["k"], **flax_args, rngs=nnx.Rngs(0)),
                          to_native("flax", canon, spec), x),
    }
    for impl, out in outputs.items():
        assert_close(out, y, err_msg=f"{impl} {c}")
    for family in ("eqx", "flax"):  # and the rule is exactly invertible
        back = to_canonical(family, to_native(family, canon, spec), spec)
        for k in canon:
            assert np.array_equal(back[k], canon[k])


@settings(SETTINGS, max_examples=examples(10))
@given(conv_cases(transpose=True))
def test_conv_transpose_rule_matches_torch(c):
    x, y, canon, spec = _reference(c, transpose=True)
    key, n = jax.random.key(0), c["n"]
    pairs = torch_padding(c["k"], c["s"], c["p"], c["op"], c["d"])
    eqx_args = (n, c["cin"], c["cout"], c["k"], c["s"], c["p"], c["op"], c["d"])
    flax_args = dict(strides=c["s"], padding=pairs, kernel_dilation=c["d"], use_bias=c["bias"])
    eqx_native = to_native("eqx", canon, spec)
    flax_native = to_native("flax", canon, spec)
    outputs = {}
    # The libraries' own layers lower to lhs_dilation, which XLA:CPU can abort on (see
    # xla_operand_swap_hazard); those cases are covered by the zoo's other methods.
    hazard = xla_operand_swap_hazard(c)
    if not hazard:
        outputs["eqx"] = _eqx_apply(eqx.nn.ConvTranspose(*eqx_args, use_bias=c["bias"], key=key),
                                    eqx_native, x)
        outputs["linen"] = _linen_apply(nn.ConvTranspose(c["cout"], c["k"], **flax_args),
                                        flax_native, x)
        outputs["nnx"] = _nnx_apply(nnx.ConvTranspose(c["cin"], c["cout"], c["k"], **flax_args,
                                                      rngs=nnx.Rngs(0)), flax_native, x)
    # One of the zoo's methods per example, in turn (tests/test_conv_transpose_methods.py checks
    # every method on every case); the rule is what is under test here.
    usable = [m for m in METHODS if not (hazard and m == "lhs_dilation")]
    for method in usable[zlib.crc32(repr(sorted(c.items())).encode()) % len(usable):][:1]:
        outputs[f"zoo-eqx-{method}"] = _eqx_apply(
            zeqx.ConvTranspose(*eqx_args, use_bias=c["bias"], method=method, key=key),
            eqx_native, x)
        outputs[f"zoo-linen-{method}"] = _linen_apply(
            zlinen.ConvTranspose(c["cout"], c["k"], **flax_args, method=method), flax_native, x)
        outputs[f"zoo-nnx-{method}"] = _nnx_apply(
            znnx.ConvTranspose(c["cin"], c["cout"], c["k"], **flax_args, method=method,
                               rngs=nnx.Rngs(0)), flax_native, x)
    for impl, out in outputs.items():
        assert_close(out, y, err_msg=f"{impl} {c}")
    for family in ("eqx", "flax"):
        back = to_canonical(family, to_native(family, canon, spec), spec)
        for k in canon:
            assert np.array_equal(back[k], canon[k])


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 5), st.integers(1, 4))
def test_linear_rule_with_flattened_input(c, h, w, out):
    """Flax flattens (H, W, C), PyTorch and Equinox (C, H, W): the kernel rows are permuted."""
    layer = torch.nn.Linear(c * h * w, out)
    x = torch.randn(3, c, h, w)
    with torch.no_grad():
        y = layer(x.flatten(1)).numpy()
    canon = {k: v.numpy() for k, v in layer.state_dict().items()}
    spec = Layer("fc", "linear", flatten_shape=(c, h, w))
    flax = to_native("flax", canon, spec)
    y_flax = _channels_last(x.numpy()).reshape(3, -1) @ flax["kernel"] + flax["bias"]
    assert_close(y_flax, y)
    back = to_canonical("flax", flax, spec)
    assert np.array_equal(back["weight"], canon["weight"])


def test_square_linear_needs_the_transpose():
    """The trap: a square layer without the transpose runs and is silently wrong."""
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    canon = {k: v.detach().numpy() for k, v in layer.state_dict().items()}
    flax = to_native("flax", canon, Layer("fc", "linear"))
    y = layer(x).detach().numpy()
    assert_close(x.numpy() @ flax["kernel"] + flax["bias"], y)
    # tolerance: must differ, by far more than rounding
    assert not np.allclose(x.numpy() @ canon["weight"] + canon["bias"], y, atol=1e-3)
