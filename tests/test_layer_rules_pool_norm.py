"""Property tests against PyTorch of the rules ResNet and the 3-D U-Net add: GroupNorm (weight
and bias <-> Flax scale and bias, contiguous channel groups, epsilon inside the square root),
max-pool (no parameters; padding with -inf, floor output sizes) and the channel concatenation
that feeds a conv (the order of the parts is the order of the conv's input channels)."""

from __future__ import annotations

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
from zoo.testing import assert_close

torch = pytest.importorskip("torch")
SETTINGS = settings(max_examples=examples(10), deadline=None, derandomize=True)
EPS = 1e-5  # PyTorch's GroupNorm default; the zoo passes it to every library (Flax's is 1e-6)


def to_native(family, canon, kind):
    return KINDS[kind].convert(family, canon, Layer("layer", kind), to="native")


def _cl(a):
    return np.moveaxis(np.asarray(a), 1, -1)


def _cf(a):
    return np.moveaxis(np.asarray(a), -1, 1)


@st.composite
def group_norm_cases(draw):
    n = draw(st.integers(1, 3))
    groups, per_group = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    # At least 2 values per group: a single one normalises rounding noise by 1/sqrt(eps).
    size = (draw(st.integers(2, 4)), *(draw(st.integers(1, 4)) for _ in range(n - 1)))
    scale = draw(st.sampled_from([1.0, 1e-3]))  # small spreads make epsilon matter
    return dict(groups=groups, channels=groups * per_group, size=size, scale=scale)


def _group_norm_reference(c, eps=EPS):
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.GroupNorm(c["groups"], c["channels"], eps=eps)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(c["channels"], generator=g))
        layer.bias.copy_(torch.randn(c["channels"], generator=g))
    # Every channel its own mean and spread: grouping the wrong channels changes the output.
    shift = torch.randn(1, c["channels"], *(1,) * len(c["size"]), generator=g)
    spread = torch.rand(1, c["channels"], *(1,) * len(c["size"]), generator=g) + 0.5
    x = (torch.randn(2, c["channels"], *c["size"], generator=g) * spread + shift) * c["scale"]
    with torch.no_grad():
        y = layer(x).numpy()
    return x.numpy(), y, {k: torch_to_numpy(v) for k, v in layer.state_dict().items()}


def _group_norm_outputs(c, x, canon, eps):
    eqx_layer = eqx.nn.GroupNorm(c["groups"], c["channels"], eps=eps)
    native = to_native("eqx", canon, "group_norm")
    eqx_layer = eqx.tree_at(lambda m: (m.weight, m.bias), eqx_layer,
                            (jnp.asarray(native["weight"]), jnp.asarray(native["bias"])))
    flax = to_native("flax", canon, "group_norm")
    linen = nn.GroupNorm(num_groups=c["groups"], epsilon=eps, use_fast_variance=False)
    nnx_layer = nnx.GroupNorm(c["channels"], num_groups=c["groups"], epsilon=eps,
                              use_fast_variance=False, rngs=nnx.Rngs(0))
    nnx_layer.scale.set_value(jnp.asarray(flax["scale"]))
    nnx_layer.bias.set_value(jnp.asarray(flax["bias"]))
    return {"eqx": np.asarray(jax.jit(jax.vmap(eqx_layer))(x)),  # one compilation each
            "linen": _cf(jax.jit(linen.apply)({"params": flax}, _cl(x))),
            "nnx": _cf(jax.jit(lambda v: nnx_layer(v))(_cl(x)))}


@SETTINGS
@given(group_norm_cases())
def test_group_norm_rule_matches_torch(c):
    x, y, canon = _group_norm_reference(c)
    for impl, out in _group_norm_outputs(c, x, canon, EPS).items():
        assert_close(out, y, err_msg=f"{impl} {c}")
    for family in ("eqx", "flax"):
        native = to_native(family, canon, "group_norm")
        back = KINDS["group_norm"].convert(family, native, Layer("layer", "group_norm"),
                                           to="canonical")
        assert all(np.array_equal(back[k], canon[k]) for k in canon)


def test_group_norm_epsilon_must_be_pinned():
    """Flax's default epsilon (1e-6) is not PyTorch's: on a small spread the outputs differ."""
    c = dict(groups=2, channels=4, size=(3, 3), scale=1e-3)
    x, y, canon = _group_norm_reference(c)
    outs = _group_norm_outputs(c, x, canon, 1e-6)
    # tolerance: must differ, by far more than rounding
    assert not np.allclose(outs["linen"], y, rtol=1e-3, atol=1e-3)


@st.composite
def pool_cases(draw):
    n = draw(st.integers(1, 3))
    k = tuple(draw(st.integers(1, 3)) for _ in range(n))
    s = tuple(draw(st.integers(1, 3)) for _ in range(n))
    p = tuple(draw(st.integers(0, ki // 2)) for ki in k)  # PyTorch: padding <= kernel / 2
    size = tuple(draw(st.integers(max(1, ki - 2 * pi), max(1, ki - 2 * pi) + 4))
                 for ki, pi in zip(k, p, strict=True))
    return dict(n=n, k=k, s=s, p=p, size=size)


@SETTINGS
@given(pool_cases())
def test_max_pool_matches_torch(c):
    """All-negative inputs: padding with zeros instead of -inf would change the border."""
    n, k, s, p = c["n"], c["k"], c["s"], c["p"]
    g = torch.Generator().manual_seed(0)
    x = -(torch.rand(2, 3, *c["size"], generator=g) + 1.0)
    pool = (torch.nn.functional.max_pool1d, torch.nn.functional.max_pool2d,
            torch.nn.functional.max_pool3d)[n - 1]
    y = pool(x, k, s, p).numpy()  # ceil_mode=False: floor((i + 2p - k) / s) + 1
    x = x.numpy()
    eqx_pool = (eqx.nn.MaxPool1d, eqx.nn.MaxPool2d, eqx.nn.MaxPool3d)[n - 1](k, s, p)
    pairs = tuple((q, q) for q in p)
    outputs = {
        "eqx": np.asarray(jax.jit(jax.vmap(eqx_pool))(x)),
        "linen": _cf(jax.jit(lambda v: nn.max_pool(v, k, strides=s, padding=pairs))(_cl(x))),
        "nnx": _cf(jax.jit(lambda v: nnx.max_pool(v, k, strides=s, padding=pairs))(_cl(x))),
    }
    for impl, out in outputs.items():
        assert out.shape == y.shape, (impl, c)
        np.testing.assert_array_equal(out, y, err_msg=f"{impl} {c}")


@st.composite
def concat_cases(draw):
    n = draw(st.integers(1, 3))
    size = tuple(draw(st.integers(1, 4)) for _ in range(n))
    return dict(n=n, size=size, skip=draw(st.integers(1, 3)), up=draw(st.integers(1, 3)),
                out=draw(st.integers(1, 3)), k=draw(st.sampled_from([1, 3])))


@settings(SETTINGS, max_examples=examples(6))
@given(concat_cases())
def test_concatenation_feeding_a_conv_keeps_the_channel_order(c):
    """torch.cat([skip, up], 1) -> conv equals each library's concatenation in the same order on
    its channel axis (Equinox 0, Flax -1) -> the conv with the plain conv rule: the conv's input
    channels are read in the order of the parts, with no permutation."""
    n, k = c["n"], (c["k"],) * c["n"]
    g = torch.Generator().manual_seed(0)
    skip = torch.randn(2, c["skip"], *c["size"], generator=g)
    up = torch.randn(2, c["up"], *c["size"], generator=g)
    conv = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)[n - 1](
        c["skip"] + c["up"], c["out"], c["k"], padding=c["k"] // 2)
    with torch.no_grad():
        y = conv(torch.cat([skip, up], dim=1)).numpy()
    canon = {key: torch_to_numpy(v) for key, v in conv.state_dict().items()}
    skip, up = skip.numpy(), up.numpy()
    pads = [(c["k"] // 2,) * 2] * n
    eqx_conv = eqx.nn.Conv(n, c["skip"] + c["up"], c["out"], k, padding=c["k"] // 2,
                           key=jax.random.key(0))
    native = to_native("eqx", canon, "conv")
    eqx_conv = eqx.tree_at(lambda m: (m.weight, m.bias), eqx_conv,
                           (jnp.asarray(native["weight"]), jnp.asarray(native["bias"])))
    flax = to_native("flax", canon, "conv")
    linen = nn.Conv(c["out"], k, padding=pads)
    eqx_apply = jax.jit(lambda a, b: jax.vmap(eqx_conv)(jnp.concatenate([a, b], axis=1)))
    linen_apply = jax.jit(lambda a, b: linen.apply({"params": flax},
                                                   jnp.concatenate([a, b], axis=-1)))
    outputs = {"eqx": np.asarray(eqx_apply(skip, up)), "linen": _cf(linen_apply(_cl(skip),
                                                                                _cl(up)))}
    for impl, out in outputs.items():
        assert_close(out, y, err_msg=f"{impl} {c}")
    if c["skip"] == c["up"]:  # the other order runs and is wrong
        swapped = _cf(linen_apply(_cl(up), _cl(skip)))
        # tolerance: must differ, by far more than rounding
        assert not np.allclose(swapped, y, atol=1e-4)
