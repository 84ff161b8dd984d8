"""Canonical names and order: PyTorch's `state_dict` order, nested module lists named alike."""

from __future__ import annotations

from itertools import pairwise

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import canonical
import converters
import zoo
from converters.checkpoints import FORMATS, Checkpoint, read, write
from tests.conftest import CASE_IDS, CASES, HAVE_TORCH

# Nested module lists (`stages[i][j]`) with two bare parameters defined after them (not in
# alphabetical order): PyTorch's state_dict lists the parameters first, then the stages row by
# row.
WIDTHS = ((3, 4), (4, 5, 6))  # stage i: linear layers WIDTHS[i][j] -> WIDTHS[i][j + 1]
TORCH_KEYS = ["scale", "offset", *(f"stages.{i}.{j}.{p}" for i, w in enumerate(WIDTHS)
                         for j in range(len(w) - 1) for p in ("weight", "bias"))]


class EqxNested(eqx.Module):
    stages: tuple[tuple[eqx.nn.Linear, ...], ...]
    scale: jax.Array
    offset: jax.Array

    def __init__(self) -> None:
        key = jax.random.key(0)
        self.stages = tuple(tuple(eqx.nn.Linear(a, b, key=key) for a, b in pairwise(w))
                            for w in WIDTHS)
        self.scale = jnp.ones(())
        self.offset = jnp.zeros(())

    def __call__(self, x: jax.Array) -> jax.Array:
        for stage in self.stages:
            for layer in stage:
                x = layer(x)
        return x * self.scale + self.offset


class LinenNested(nn.Module):
    def setup(self) -> None:
        self.stages = [[nn.Dense(b) for b in w[1:]] for w in WIDTHS]
        self.scale = self.param("scale", nn.initializers.ones, ())
        self.offset = self.param("offset", nn.initializers.zeros, ())

    def __call__(self, x: jax.Array) -> jax.Array:
        for stage in self.stages:
            for layer in stage:
                x = layer(x)
        return x * self.scale + self.offset


class NNXNested(nnx.Module):
    def __init__(self) -> None:
        rngs = nnx.Rngs(0)
        self.stages = nnx.List([nnx.List([nnx.Linear(a, b, rngs=rngs)
                                          for a, b in pairwise(w)]) for w in WIDTHS])
        self.scale = nnx.Param(jnp.ones(()))
        self.offset = nnx.Param(jnp.zeros(()))

    def __call__(self, x: jax.Array) -> jax.Array:
        for stage in self.stages:
            for layer in stage:
                x = layer(x)
        return x * self.scale + self.offset


def _nested(impl: str) -> tuple[object, dict]:
    """The toy model of `impl` and the walkers' facts for it."""
    if impl == "eqx":
        return EqxNested(), {}
    if impl == "linen":
        x = jnp.zeros((1, WIDTHS[0][0]))
        return (LinenNested(), LinenNested().init(jax.random.key(0), x)), {"example": x}
    return NNXNested(), {}


@pytest.mark.parametrize("impl", zoo.JAX_IMPLS)
def test_nested_module_lists_get_the_same_names_in_every_library(impl: str):
    """`stages.i.j` in every library (Linen names the items `stages_i_j` itself), listed as
    PyTorch's state_dict lists them: the bare parameter first, then the stages in order."""
    model, facts = _nested(impl)
    state = canonical.read(model, impl, **facts)
    assert list(state) == TORCH_KEYS
    assert state["stages.1.1.weight"].shape == (6, 5)
    back = canonical.read(canonical.write(model, state, impl, **facts), impl, **facts)
    assert list(back) == TORCH_KEYS


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
def test_the_nested_toy_keys_are_pytorchs():
    import torch

    class TorchNested(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stages = torch.nn.ModuleList(
                torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in pairwise(w))
                for w in WIDTHS)
            self.scale = torch.nn.Parameter(torch.ones(()))
            self.offset = torch.nn.Parameter(torch.zeros(()))

    assert list(TorchNested().state_dict()) == TORCH_KEYS
    assert list(canonical.read(TorchNested(), "torch")) == TORCH_KEYS


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
@pytest.mark.parametrize(("name", "config"), CASES, ids=CASE_IDS)
def test_canonical_keys_come_in_the_torch_state_dict_order(name: str, config: zoo.Config):
    """Every registered architecture: its canonical state from every JAX library, its canonical
    initialisation and its spec list the keys as the PyTorch model's `state_dict()` does."""
    want = list(zoo.create(config, "torch").state_dict())
    assert list(zoo.canonical_init(config)) == want
    assert list(converters.canonical_spec(config)) == want
    for impl in zoo.JAX_IMPLS:
        assert list(converters.to_canonical(zoo.create(config, impl), impl)) == want, impl


@pytest.mark.parametrize("fmt", FORMATS)
def test_checkpoints_read_back_in_the_canonical_order(fmt: str, tmp_path):
    """Every format, safetensors (which stores its keys sorted) included, reads back the keys
    in the canonical order."""
    if fmt == "torch" and not HAVE_TORCH:
        pytest.skip("needs torch")
    config = zoo.tiny_config("cnn")
    state = zoo.canonical_init(config)
    assert list(state) != sorted(state)  # convs.* before bns.*: the test can tell
    for name in ("model.safetensors", "model.pt") if fmt == "torch" else ("model",):
        path = write(Checkpoint(config, state), tmp_path / f"{fmt}-{name}", fmt)
        assert list(read(path).state) == list(state), name


class LinenCalledOutOfOrder(nn.Module):
    """Defines `attn`, `mlp`, `norm1`, `norm2` (a Llama layer's order) and calls the norms
    first."""

    def setup(self) -> None:
        self.attn = nn.Dense(3)
        self.mlp = nn.Dense(3)
        self.norm1 = nn.LayerNorm()
        self.norm2 = nn.LayerNorm()

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def test_linen_layers_come_in_definition_order_not_call_order():
    """PyTorch lists a module's layers as it defines them; so does the Linen walker, whatever
    order `__call__` runs them in (`setup`'s assignment order)."""
    x = jnp.zeros((1, 3))
    model = LinenCalledOutOfOrder()
    state = canonical.read((model, model.init(jax.random.key(0), x)), "linen", example=x)
    assert [k.split(".")[0] for k in state][::2] == ["attn", "mlp", "norm1", "norm2"]
