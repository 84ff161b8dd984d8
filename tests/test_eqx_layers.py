"""The zoo's Equinox Linear and MultiheadAttention compute what Equinox's do, with the same
fields (so converters see the same layer kinds)."""

from __future__ import annotations

import pkgutil

import equinox as eqx
import jax
import numpy as np
import pytest

import canonical
import zoo
import zoo.models
from zoo.layers.eqx import Conv1D, Linear, MultiheadAttention
from zoo.testing import assert_close

KEY = jax.random.key(0)


@pytest.mark.parametrize(("n_in", "n_out", "bias"),
                         [(5, 3, True), (5, 3, False), ("scalar", 4, True), (4, "scalar", True)])
def test_linear_equals_equinox_under_nested_vmap(n_in, n_out, bias):
    ref = eqx.nn.Linear(n_in, n_out, use_bias=bias, key=KEY)
    zoo_linear = Linear.of(ref)
    shape = (2, 3) if n_in == "scalar" else (2, 3, n_in)
    x = jax.random.normal(jax.random.key(1), shape)
    want = jax.vmap(jax.vmap(ref))(x)
    got = jax.vmap(jax.vmap(zoo_linear))(x)
    assert got.shape == want.shape
    assert_close(got, want)
    built = Linear(n_in, n_out, use_bias=bias, key=KEY)
    assert isinstance(built, eqx.nn.Linear)
    for a, b in zip(jax.tree.leaves(built), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(a, b)  # same initialisation, same layout


def test_multihead_attention_equals_equinox_and_keeps_its_kind():
    args = dict(num_heads=2, query_size=8, use_query_bias=True, use_key_bias=True,
                use_value_bias=True, use_output_bias=True, key=KEY)
    ref, attn = eqx.nn.MultiheadAttention(**args), MultiheadAttention(**args)
    for name in ("query_proj", "key_proj", "value_proj", "output_proj"):
        assert type(getattr(attn, name)) is Linear
    for a, b in zip(jax.tree.leaves(attn), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(a, b)
    x = jax.random.normal(jax.random.key(2), (3, 5, 8))
    assert_close(jax.vmap(lambda t: attn(t, t, t))(x), jax.vmap(lambda t: ref(t, t, t))(x))
    assert canonical.kind_of(attn, "eqx") is canonical.kind_of(ref, "eqx") is not None
    assert canonical.kind_of(attn.query_proj, "eqx") is canonical.kind_of(
        ref.query_proj, "eqx") is not None


ZOO_ARCHS = [a for a in zoo.ARCHS  # the zoo's own (not the test-only toy)
             if a in {m.name for m in pkgutil.iter_modules(zoo.models.__path__)}]


def _eqx_model(arch):
    made = zoo.create(zoo.tiny_config(arch), "eqx")
    return made[0] if isinstance(made, tuple) else made


def _linears(model):
    return [x for x in jax.tree.leaves(model, is_leaf=lambda x: isinstance(x, eqx.nn.Linear))
            if isinstance(x, eqx.nn.Linear)]


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_every_equinox_model_uses_the_zoos_linear(arch):
    """One layer kind, one object: no model of the zoo keeps a plain `eqx.nn.Linear` (whose
    `weight @ x` under `vmap` makes XLA transpose its outputs); GPT-2's `Conv1D` is the zoo's
    Linear under transformers' layout."""
    assert all(type(x) in (Linear, Conv1D) for x in _linears(_eqx_model(arch))), arch


def test_new_heads_are_the_zoos_linear():
    """`reset_classifier`, wherever a model has it, gives a zoo `Linear` head too."""
    models = [m for m in map(_eqx_model, ZOO_ARCHS) if hasattr(m, "reset_classifier")]
    assert models  # the classifiers with timm's fine-tuning method
    for m in models:
        heads = _linears(m.reset_classifier(3, key=KEY))
        assert heads and all(type(x) is Linear for x in heads)
