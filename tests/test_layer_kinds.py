"""Layer kinds: every array of a model is converted or named in a refusal, in every library.

Models holding the layer types each library ships (and a list of blocks, and a bare parameter)
are walked: the arrays the kinds convert are exactly the model's leaves, canonical names are the
same in every library (`blocks.0`, also for Linen, which names list items `blocks_0`), a
composite kind (attention) is not looked into, and a layer type without a kind (a GRU cell, a
PReLU or an Einsum) is refused with the names of its arrays. A toy kind registered here
converts in all four libraries. ConvNeXt's layers (a depthwise convolution, timm's LayerNorm2d,
GRN) convert and compute timm's outputs in every library.
"""

from __future__ import annotations

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

import canonical
import converters
import zoo
from canonical import KINDS, ConversionError, LayerKind
from zoo.layers.batch_norm import BatchNorm
from zoo.layers.eqx import GlobalResponseNorm as EqxGRN
from zoo.layers.eqx import LayerNorm2d
from zoo.layers.linen import GlobalResponseNorm as LinenGRN
from zoo.layers.linen import LayerNorm as LinenLayerNorm
from zoo.layers.nnx import GlobalResponseNorm as NNXGRN
from zoo.layers.nnx import LayerNorm as NNXLayerNorm
from zoo.testing import assert_close

torch = pytest.importorskip("torch")
C = 4  # channels of every layer, so that shapes agree across libraries
KEY = jax.random.key(0)
LINEN_INPUT = jax.ShapeDtypeStruct((1, 5, 5, C), jnp.float32)


# --------------------------------------------------------------------------- one model per library
class EqxModel(eqx.Module):
    blocks: list[eqx.nn.Linear]
    conv: eqx.nn.Conv2d
    up: eqx.nn.ConvTranspose2d
    bn: BatchNorm
    ln: eqx.nn.LayerNorm
    gn: eqx.nn.GroupNorm
    emb: eqx.nn.Embedding
    rms: eqx.nn.RMSNorm
    attn: eqx.nn.MultiheadAttention
    token: jax.Array
    extra: list[eqx.Module]

    def __init__(self, unsupported: bool) -> None:
        k = jax.random.split(KEY, 8)
        self.blocks = [eqx.nn.Linear(C, C, key=k[0]), eqx.nn.Linear(C, C, key=k[1])]
        self.conv = eqx.nn.Conv2d(C, C, (3, 3), key=k[2])
        self.up = eqx.nn.ConvTranspose2d(C, C, (2, 2), stride=2, key=k[3])
        self.bn = BatchNorm(C)
        self.ln = eqx.nn.LayerNorm(C)
        self.gn = eqx.nn.GroupNorm(2, C)
        self.emb = eqx.nn.Embedding(10, C, key=k[4])
        self.rms = eqx.nn.RMSNorm(C, use_bias=False)  # as the others: a weight only
        self.attn = eqx.nn.MultiheadAttention(2, C, use_query_bias=True, use_key_bias=True,
                                              use_value_bias=True, use_output_bias=True, key=k[6])
        self.token = jnp.zeros((1, C))
        self.extra = [eqx.nn.GRUCell(C, C, key=k[5]), eqx.nn.PReLU()] if unsupported else []


class LinenModel(nn.Module):
    unsupported: bool

    def setup(self) -> None:
        self.blocks = [nn.Dense(C), nn.Dense(C)]
        self.conv = nn.Conv(C, (3, 3))
        self.up = nn.ConvTranspose(C, (2, 2), strides=(2, 2))
        self.bn = nn.BatchNorm(use_running_average=True)
        self.ln = nn.LayerNorm()
        self.gn = nn.GroupNorm(2)
        self.emb = nn.Embed(10, C)
        self.rms = nn.RMSNorm()
        self.attn = nn.MultiHeadDotProductAttention(2)
        self.token = self.param("token", nn.initializers.zeros, (1, C))
        if self.unsupported:
            self.gru = nn.GRUCell(C)
            self.other = nn.Einsum((C, C), "nc,cd->nd")

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.gn(self.ln(self.bn(self.up(self.conv(x)))))
        y = self.blocks[1](self.blocks[0](y)).reshape(1, -1, C)
        y = y + self.emb(jnp.zeros((1, 1), jnp.int32)) + self.token[None]
        y = self.attn(self.rms(y))
        if self.unsupported:
            y = self.other(self.gru(y.reshape(-1, C), y.reshape(-1, C))[1])
        return y


class NNXModel(nnx.Module):
    def __init__(self, unsupported: bool) -> None:
        r = nnx.Rngs(0)
        self.blocks = nnx.List([nnx.Linear(C, C, rngs=r), nnx.Linear(C, C, rngs=r)])
        self.conv = nnx.Conv(C, C, (3, 3), rngs=r)
        self.up = nnx.ConvTranspose(C, C, (2, 2), strides=(2, 2), rngs=r)
        self.bn = nnx.BatchNorm(C, rngs=r)
        self.ln = nnx.LayerNorm(C, rngs=r)
        self.gn = nnx.GroupNorm(C, num_groups=2, rngs=r)
        self.emb = nnx.Embed(10, C, rngs=r)
        self.rms = nnx.RMSNorm(C, rngs=r)
        self.attn = nnx.MultiHeadAttention(2, C, decode=False, rngs=r)
        self.token = nnx.Param(jnp.zeros((1, C)))
        if unsupported:
            self.gru = nnx.GRUCell(C, C, rngs=r)
            self.other = nnx.Einsum("nc,cd->nd", (C, C), rngs=r)


class TorchModel(torch.nn.Module):
    """A user's module (a bare `torch.nn.Module` would be a library class)."""


def torch_model(unsupported: bool) -> torch.nn.Module:
    m = TorchModel()
    m.blocks = torch.nn.ModuleList([torch.nn.Linear(C, C), torch.nn.Linear(C, C)])
    m.conv = torch.nn.Conv2d(C, C, 3)
    m.up = torch.nn.ConvTranspose2d(C, C, 2, stride=2)
    m.bn = torch.nn.BatchNorm2d(C)
    m.ln = torch.nn.LayerNorm(C)
    m.gn = torch.nn.GroupNorm(2, C)
    m.emb = torch.nn.Embedding(10, C)
    m.rms = torch.nn.RMSNorm(C)
    m.attn = torch.nn.MultiheadAttention(C, 2)
    m.token = torch.nn.Parameter(torch.zeros(1, C))
    if unsupported:
        m.gru = torch.nn.GRUCell(C, C)
        m.other = torch.nn.PReLU()
    return m


def build(impl: str, unsupported: bool) -> tuple[object, int]:
    """A model of `impl` and the number of its parameters and statistics."""
    if impl == "eqx":
        model, state = eqx.nn.make_with_state(EqxModel)(unsupported)
        leaves = [x for x in jax.tree.leaves(model) if eqx.is_array(x)] + jax.tree.leaves(state)
        return (model, state), len(leaves)
    if impl == "linen":
        module = LinenModel(unsupported)
        variables = module.init(KEY, jnp.zeros(LINEN_INPUT.shape))
        return (module, variables), len(jax.tree.leaves(variables))
    if impl == "nnx":
        model = NNXModel(unsupported)
        state = nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat))
        return model, len(jax.tree.leaves(state))
    model = torch_model(unsupported)
    return model, len(model.state_dict())


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_every_leaf_is_converted(impl):
    model, n_leaves = build(impl, unsupported=False)
    walker = canonical.WALKERS[impl]
    layers = walker.layers(model, example=LINEN_INPUT)
    native = walker.read(model, layers)
    assert sum(len(a) for a in native.values()) == n_leaves
    kinds = {layer.name: layer.kind for layer in layers}
    assert kinds == {"blocks.0": "linear", "blocks.1": "linear", "conv": "conv",
                     "up": "conv_transpose", "bn": "batch_norm", "ln": "layer_norm",
                     "gn": "group_norm", "emb": "embedding", "rms": "rms_norm",
                     "attn": "attention",
                     "token": "parameter"}


def test_canonical_names_and_shapes_are_the_same_in_every_library():
    specs = {}
    for impl in zoo.IMPLS:
        state = canonical.read(build(impl, unsupported=False)[0], impl, example=LINEN_INPUT)
        specs[impl] = {k: np.shape(v) for k, v in state.items()}
    assert "blocks.0.weight" in specs["linen"] and "token" in specs["linen"]
    assert specs["linen"]["attn.qkv.weight"] == (3 * C, C)
    for impl in zoo.IMPLS:
        assert specs[impl] == specs["torch"], impl


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_layers_without_a_kind_are_refused_by_name(impl):
    model, _ = build(impl, unsupported=True)
    with pytest.raises(ConversionError, match="no layer kind converts") as info:
        canonical.read(model, impl, example=LINEN_INPUT)
    message = str(info.value)
    assert "gru" in message.lower(), message  # the library classes, in every library
    assert "prelu" in message.lower() or "einsum" in message.lower(), message
    for converted in ("'blocks", "'conv", "'token", "'bn", "'ln", "'emb", "'attn"):
        assert converted not in message


def test_a_model_without_a_zoo_config_gets_a_clear_error():
    with pytest.raises(ConversionError, match="has no zoo config"):
        converters.to_canonical(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), "nnx")


# --------------------------------------------------------------------------- a toy layer kind
class EqxScale(eqx.Module):
    weight: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.weight


class LinenScale(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # Flax-style: a (1, C) "gain" row
        return x * self.param("gain", nn.initializers.ones, (1, x.shape[-1]))


class NNXScale(nnx.Module):
    def __init__(self) -> None:
        self.gain = nnx.Param(jnp.ones((1, C)))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.gain[...]


class TorchScale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def _gain(family, arrays, layer):
    return {"gain": arrays["weight"].reshape(1, -1)} if family == "flax" else dict(arrays)


def _weight(family, arrays, layer):
    return {"weight": arrays["gain"].reshape(-1)} if family == "flax" else dict(arrays)


SCALE = LayerKind(
    "scale", classes={"eqx": (EqxScale,), "linen": (LinenScale,), "nnx": (NNXScale,),
                      "torch": (TorchScale,)},
    native={"eqx": ("weight",), "flax": ("gain",)},
    init=lambda shapes, rng: {"weight": rng.uniform(0.5, 1.5, shapes["weight"])},
    to_native=_gain, to_canonical=_weight)


class LinenHolder(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return LinenScale(name="scale")(x)


class NNXHolder(nnx.Module):
    def __init__(self) -> None:
        self.scale = NNXScale()


class EqxHolder(eqx.Module):
    scale: EqxScale


def _holders() -> dict[str, object]:
    linen = LinenHolder()
    torch_holder = TorchModel()
    torch_holder.scale = TorchScale()
    return {"eqx": EqxHolder(EqxScale(jnp.ones(C))),
            "linen": (linen, linen.init(KEY, jnp.zeros((1, C)))),
            "nnx": NNXHolder(), "torch": torch_holder}


def test_a_toy_layer_kind_converts_in_all_four_libraries():
    state = {"scale.weight": np.linspace(0.5, 1.5, C).astype(np.float32)}
    facts = {"example": jax.ShapeDtypeStruct((1, C), jnp.float32)}
    before = {impl: canonical.read(m, impl, **facts) for impl, m in _holders().items()}
    # Without the kind the toy layers' arrays are bare parameters named by native paths.
    assert set(before["linen"]) == {"scale.gain"} and set(before["torch"]) == {"scale.weight"}
    canonical.register_kind(SCALE)
    try:
        x = np.arange(2 * C, dtype=np.float32).reshape(2, C)
        for impl, skeleton in _holders().items():
            model = canonical.write(skeleton, state, impl, **facts)
            back = canonical.read(model, impl, **facts)
            assert set(back) == {"scale.weight"}
            assert np.asarray(back["scale.weight"]).tobytes() == state["scale.weight"].tobytes()
            if impl == "linen":
                y = model[0].apply(model[1], x)
            elif impl == "torch":
                y = model.scale(torch.from_numpy(x)).detach().numpy()
            elif impl == "eqx":  # per sample
                y = jax.vmap(model.scale)(x)
            else:
                y = model.scale(x)
            np.testing.assert_array_equal(np.asarray(y), x * state["scale.weight"])
    finally:
        canonical.unregister_kind("scale")


# --------------------------------------------------------------------------- ConvNeXt's layers
# timm's depthwise 7x7 convolution (groups = channels: the `conv` kind's grouped rule), its
# LayerNorm2d (the `layer_norm` kind: the zoo's Equinox LayerNorm2d, a Flax LayerNorm over a
# channels-last map, PyTorch's LayerNorm subclass) and GlobalResponseNorm (its own kind).
D = 6  # channels


class EqxParts(eqx.Module):
    dw: eqx.nn.Conv2d
    ln: LayerNorm2d
    grn: EqxGRN

    def __init__(self) -> None:
        self.dw = eqx.nn.Conv2d(D, D, (7, 7), padding=3, groups=D, key=KEY)
        self.ln = LayerNorm2d(D)
        self.grn = EqxGRN(D)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.grn(self.ln(self.dw(x)))


class LinenParts(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Conv(D, (7, 7), padding=((3, 3), (3, 3)), feature_group_count=D, name="dw")(x)
        return LinenGRN(name="grn")(LinenLayerNorm(epsilon=1e-6, name="ln")(x))


class NNXParts(nnx.Module):
    def __init__(self) -> None:
        r = nnx.Rngs(0)
        self.dw = nnx.Conv(D, D, (7, 7), padding=((3, 3), (3, 3)), feature_group_count=D, rngs=r)
        self.ln = NNXLayerNorm(D, epsilon=1e-6, rngs=r)
        self.grn = NNXGRN(D)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.grn(self.ln(self.dw(x)))


def _parts(impl: str):
    if impl == "eqx":
        return EqxParts()
    if impl == "linen":
        module = LinenParts()
        return module, module.init(KEY, jnp.zeros((1, 9, 8, D)))
    if impl == "nnx":
        return NNXParts()
    from zoo.layers import torch as zoo_torch

    m = TorchModel()
    m.dw = torch.nn.Conv2d(D, D, 7, padding=3, groups=D)
    m.ln = zoo_torch.LayerNorm2d(D)
    m.grn = zoo_torch.GlobalResponseNorm(D, channels_last=False)
    m.forward = lambda x: m.grn(m.ln(m.dw(x)))
    return m


def _run_parts(impl: str, model, x: np.ndarray) -> np.ndarray:
    if impl == "eqx":
        return np.asarray(jax.vmap(model)(jnp.asarray(x)))
    if impl == "torch":
        with torch.no_grad():
            return model.forward(torch.from_numpy(x)).numpy()
    xl = jnp.asarray(x.transpose(0, 2, 3, 1))
    y = model[0].apply(model[1], xl) if impl == "linen" else model(xl)
    return np.asarray(y).transpose(0, 3, 1, 2)


def test_convnext_layers_convert_and_compute_timms_in_every_library():
    """Random arrays through each kind's rule into every library give timm's outputs (its
    depthwise Conv2d, LayerNorm2d and GlobalResponseNorm on the same arrays) and read back
    bitwise; the kinds, the shapes of a depthwise kernel and the logical axes are pinned
    (fsdp shards a depthwise kernel over its channels, tp a GRN over the MLP's)."""
    layers = pytest.importorskip("timm.layers")
    grn_module = pytest.importorskip("timm.layers.grn")
    rng = np.random.default_rng(0)
    state = {"dw.weight": rng.standard_normal((D, 1, 7, 7)), "dw.bias": rng.standard_normal(D),
             "ln.weight": 1 + 0.1 * rng.standard_normal(D), "ln.bias": rng.standard_normal(D),
             "grn.weight": rng.standard_normal(D), "grn.bias": rng.standard_normal(D)}
    state = {k: v.astype(np.float32) for k, v in state.items()}
    x = rng.standard_normal((2, D, 9, 8)).astype(np.float32)
    ref = torch.nn.Sequential(torch.nn.Conv2d(D, D, 7, padding=3, groups=D),
                              layers.LayerNorm2d(D),
                              grn_module.GlobalResponseNorm(D, channels_last=False))
    ref.load_state_dict({k.replace("dw", "0").replace("ln", "1").replace("grn", "2"):
                         torch.from_numpy(v) for k, v in state.items()})
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    facts = {"example": jax.ShapeDtypeStruct((1, 9, 8, D), jnp.float32)}
    for impl in zoo.IMPLS:
        skeleton = _parts(impl)
        kinds = {layer.name: layer.kind for layer in canonical.layers(skeleton, impl, **facts)}
        assert kinds == {"dw": "conv", "ln": "layer_norm", "grn": "global_response_norm"}, impl
        model = canonical.write(skeleton, state, impl, **facts)
        back = canonical.read(model, impl, **facts)
        assert {k: np.asarray(v).tobytes() for k, v in back.items()} == {
            k: v.tobytes() for k, v in state.items()}, impl
        assert_close(_run_parts(impl, model, x), want, err_msg=impl)
    grn, conv = KINDS["global_response_norm"], KINDS["conv"]
    assert grn.logical_axes("flax", "scale", 1) == grn.logical_axes("eqx", "weight", 1) == (
        "mlp",)
    data = AbstractMesh((4,), ("data",))
    fsdp = zoo.runtime.sharding.strategy("fsdp")
    assert fsdp.spec(conv.logical_axes("flax", "kernel", 4), (7, 7, 1, 8), data) == P(
        None, None, None, "data")
    assert fsdp.spec(conv.logical_axes("eqx", "weight", 4), (8, 1, 7, 7), data) == P(
        "data", None, None, None)
    tp = zoo.runtime.sharding.strategy("tp")
    assert tp.spec(grn.logical_axes("flax", "scale", 1), (8,),
                   AbstractMesh((2, 2), ("data", "model"))) == P("model")


def test_grn_gradient_is_finite_on_an_all_zero_channel():
    """GELU gives exact zeros, and a 1x1 map is one value: an all-zero channel has PyTorch's
    zero gradient through the L2 norm, not NaN."""
    x = jnp.zeros((1, 1, 1, 3)).at[..., 0].set(2.0)
    layer = LinenGRN()
    variables = {"params": {"scale": jnp.ones(3), "bias": jnp.zeros(3)}}
    g = jax.grad(lambda v: layer.apply(variables, v).sum())(x)
    assert np.isfinite(np.asarray(g)).all()
    xt = torch.zeros(1, 1, 1, 3)
    xt[..., 0] = 2.0
    xt.requires_grad_()
    from zoo.layers import torch as zoo_torch

    t = zoo_torch.GlobalResponseNorm(3)
    with torch.no_grad():
        t.weight.fill_(1.0)
    t(xt).sum().backward()
    assert_close(np.asarray(g), xt.grad.numpy())
