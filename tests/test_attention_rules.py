"""Property tests of the attention and LayerNorm rules against PyTorch.

For random heads, head_dim, sequence length and batch, with and without biases, a PyTorch
`nn.MultiheadAttention` with random weights (biases included) is converted with the attention
kind's rules into `eqx.nn.MultiheadAttention`, Linen `MultiHeadDotProductAttention` and
`nnx.MultiHeadAttention`: outputs, input gradients and parameter gradients (converted back to
the canonical layout) must equal PyTorch's, and the rules must be exact inverses.
"""

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
from canonical.walkers import get
from tests.conftest import examples
from zoo.layers.attention import dot_product_attention
from zoo.testing import assert_close

torch = pytest.importorskip("torch")
SETTINGS = settings(max_examples=examples(8), deadline=None, derandomize=True)
KIND = KINDS["attention"]


@st.composite
def attention_cases(draw):
    return dict(heads=draw(st.integers(1, 3)), head_dim=draw(st.integers(1, 4)),
                seq=draw(st.integers(1, 5)), batch=draw(st.integers(1, 2)))


def _torch_reference(c):
    """Canonical weights, input, cotangent, output and canonical gradients of a PyTorch MHA."""
    e = c["heads"] * c["head_dim"]
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(e, c["heads"], bias=c["bias"], batch_first=True)
    with torch.no_grad():  # PyTorch starts the biases at zero: make every array matter
        for p in m.parameters():
            p.copy_(0.5 * torch.randn_like(p))
    x = torch.randn(c["batch"], c["seq"], e, requires_grad=True)
    y = m(x, x, x, need_weights=False)[0]
    cotangent = torch.randn_like(y)
    (y * cotangent).sum().backward()
    native = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    grads = {k: p.grad.numpy() for k, p in m.named_parameters()}
    layer = Layer("attn", "attention", facts=(("num_heads", c["heads"]),))
    return (KIND.convert("torch", native, layer, to="canonical"), layer, x.detach().numpy(),
            cotangent.numpy(), y.detach().numpy(), x.grad.numpy(),
            KIND.convert("torch", grads, layer, to="canonical"))


def _flat(tree) -> dict[str, np.ndarray]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {".".join(str(getattr(k, "key", k)) for k in path): np.asarray(v) for path, v in flat}


def _eqx(c, native, x, cot):
    e = c["heads"] * c["head_dim"]
    b = c["bias"]
    layer = eqx.nn.MultiheadAttention(c["heads"], e, use_query_bias=b, use_key_bias=b,
                                      use_value_bias=b, use_output_bias=b, key=jax.random.key(0))
    names = list(native)
    layer = eqx.tree_at(lambda m: [get(m, n.split(".")) for n in names], layer,
                        [jnp.asarray(native[n]) for n in names])

    def loss(layer, x):
        y = jax.vmap(lambda t: layer(t, t, t))(x)
        return jnp.sum(y * cot), y

    (_, y), (g, gx) = eqx.filter_jit(eqx.filter_value_and_grad(
        lambda args: loss(*args), has_aux=True))((layer, x))
    return y, gx, {n: get(g, n.split(".")) for n in names}


def _linen(c, native, x, cot):
    module = nn.MultiHeadDotProductAttention(c["heads"], use_bias=c["bias"])
    params: dict = {}
    for n, v in native.items():
        sub, leaf = n.split(".")
        params.setdefault(sub, {})[leaf] = jnp.asarray(v)

    def loss(params, x):
        y = module.apply({"params": params}, x)
        return jnp.sum(y * cot), y

    (_, y), (g, gx) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
    return y, gx, _flat(g)


def _nnx(c, native, x, cot):
    e = c["heads"] * c["head_dim"]
    model = nnx.MultiHeadAttention(c["heads"], e, use_bias=c["bias"], decode=False,
                                   rngs=nnx.Rngs(0))
    for n, v in native.items():
        get(model, n.split(".")).set_value(jnp.asarray(v))
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(params, x):
        y = nnx.merge(graphdef, params)(x)
        return jnp.sum(y * cot), y

    (_, y), (g, gx) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
    return y, gx, {".".join(map(str, p)): np.asarray(v.get_value() if hasattr(v, "get_value")
                                                      else v)
                   for p, v in nnx.to_flat_state(g)}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@settings(SETTINGS, max_examples=examples(3))  # each example compiles 3 forward+backward programs
@given(attention_cases())
def test_attention_rule_matches_torch_forward_and_gradients(bias, c):
    c = {**c, "bias": bias}
    canon, layer, x, cot, y, gx, grads = _torch_reference(c)
    assert set(canon) == ({"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"} if c["bias"]
                          else {"qkv.weight", "proj.weight"})
    for impl, run, family in (("eqx", _eqx, "eqx"), ("linen", _linen, "flax"),
                              ("nnx", _nnx, "flax")):
        native = KIND.convert(family, canon, layer, to="native")
        y_jax, gx_jax, g_native = run(c, native, jnp.asarray(x), jnp.asarray(cot))
        assert_close(y_jax, y, err_msg=f"{impl} forward {c}")
        assert_close(gx_jax, gx, err_msg=f"{impl} input gradient {c}")
        g_canon = KIND.convert(family, g_native, layer, to="canonical")
        assert set(g_canon) == set(grads), impl
        for k in grads:
            assert_close(g_canon[k], grads[k], err_msg=f"{impl} {k} {c}")
        back = KIND.convert(family, native, layer, to="canonical")
        assert {k: v.tobytes() for k, v in back.items()} == {
            k: v.tobytes() for k, v in canon.items()}, f"{impl}: the rules are not inverses"


def test_square_attention_needs_the_head_split():
    """The trap: a Flax kernel filled with the canonical rows without the transpose runs (all
    shapes square) and is silently wrong."""
    c = dict(heads=2, head_dim=2, seq=3, batch=1, bias=True)
    canon, layer, x, cot, y, *_ = _torch_reference(c)
    native = KIND.convert("flax", canon, layer, to="native")
    wrong = dict(native)
    for p, w in zip(("query", "key", "value"), np.split(canon["qkv.weight"], 3), strict=True):
        wrong[f"{p}.kernel"] = w.reshape(4, 2, 2)  # no transpose
    y_wrong = _linen(c, wrong, jnp.asarray(x), jnp.asarray(cot))[0]
    # tolerance: must differ, by far more than rounding
    assert not np.allclose(y_wrong, y, atol=1e-3)


@pytest.mark.parametrize("family", ["eqx", "flax", "torch"])
def test_attention_layouts_the_rules_cannot_express_are_refused(family):
    key = jax.random.key(0)
    refused = {
        "eqx": (eqx.nn.MultiheadAttention(2, 4, qk_size=2, vo_size=3, key=key), "eqx"),
        "flax": (nnx.MultiHeadAttention(2, 4, decode=False, normalize_qk=True, rngs=nnx.Rngs(0)),
                 "nnx"),
        "torch": (torch.nn.MultiheadAttention(4, 2, kdim=3, vdim=3), "torch"),
    }
    module, impl = refused[family]
    with pytest.raises(ValueError, match=r"attention layer 'attn'.*not supported"):
        KIND.check(module, impl, "attn")


@SETTINGS
@given(st.integers(1, 6), st.sampled_from([1e-6, 1e-5, 1e-3]))
def test_layer_norm_rule_matches_torch(width, eps):
    """weight/bias <-> scale/bias, with the epsilon passed explicitly in every library."""
    torch.manual_seed(width)
    layer = torch.nn.LayerNorm(width, eps=eps)
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    x = 1e-2 * torch.randn(3, width)  # a small spread: the epsilon matters
    y = layer(x).detach().numpy()
    canon = {k: v.detach().numpy() for k, v in layer.state_dict().items()}
    spec, kind = Layer("ln", "layer_norm"), KINDS["layer_norm"]
    flax = kind.convert("flax", canon, spec, to="native")
    assert set(flax) == {"scale", "bias"}
    xs = jnp.asarray(x.numpy())
    outs = {
        "eqx": eqx.filter_jit(lambda m, x: jax.vmap(m)(x))(eqx.tree_at(
            lambda m: (m.weight, m.bias), eqx.nn.LayerNorm(width, eps=eps),
            (jnp.asarray(canon["weight"]), jnp.asarray(canon["bias"]))), xs),
        "linen": jax.jit(nn.LayerNorm(epsilon=eps, use_fast_variance=False).apply)(
            {"params": flax}, xs),  # each compiled: one program, not one per operation
    }
    for impl, out in outs.items():
        assert_close(out, y, err_msg=f"{impl} eps={eps}")
    back = kind.convert("flax", flax, spec, to="canonical")
    assert all(np.array_equal(back[k], canon[k]) for k in canon)


def test_zoo_attention_softmax_is_float32_in_bfloat16():
    """The Flax ViTs' attention function computes what Equinox's does in bfloat16 (softmax in
    float32), which Flax's default (softmax in bfloat16) does not."""
    q, k, v = (jax.random.normal(jax.random.key(i), (6, 2, 8)).astype(jnp.bfloat16) * 4
               for i in range(3))
    ours = dot_product_attention(q[None], k[None], v[None])[0]
    theirs = jax.vmap(eqx.nn._attention.dot_product_attention, in_axes=1, out_axes=1)(q, k, v)
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(theirs, np.float32))
    assert ours.dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="mask"):
        dot_product_attention(q, k, v, mask=jnp.ones((2, 6, 6), bool))
