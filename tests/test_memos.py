"""What the converters remember between calls: an abstract skeleton per (class, config, dtype)
(`zoo.registry.skeleton`) and a Linen walk per module and variable shapes
(`canonical.walkers.LinenWalker`), each given out so that no caller can change another's."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import canonical
import zoo
from canonical.kinds import KINDS, register_kind
from converters.core import from_canonical, to_canonical
from zoo import registry
from zoo.registry import skeleton, walk_facts

CFG = zoo.tiny_config("cnn")


@pytest.mark.parametrize("impl", zoo.JAX_IMPLS)
def test_an_abstract_skeleton_is_built_once_and_given_out_as_a_copy(impl, monkeypatch):
    lib = zoo.libraries.library(impl)
    zoo.model_class(CFG.arch, impl)  # its contract checked (which builds a skeleton of its own)
    built = []
    real = type(lib).skeleton
    monkeypatch.setattr(type(lib), "skeleton",
                        lambda self, *a: built.append(a) or real(self, *a))
    registry._abstract_skeleton.cache_clear()
    first, second = skeleton(CFG, impl), skeleton(CFG, impl)
    assert len(built) == 1
    state = zoo.canonical_init(CFG)
    written = canonical.write(first, state, impl, **walk_facts(CFG, impl))
    params = lambda model: jax.tree.leaves(zoo.interface(impl).split(model)[1])
    assert all(isinstance(a, jax.Array) for a in params(written))
    # The other copy (and the remembered one) are still abstract: writing changed neither.
    for untouched in (second, skeleton(CFG, impl)):
        assert all(isinstance(a, jax.ShapeDtypeStruct) for a in params(untouched))
    assert skeleton(CFG, impl, "bfloat16") is not None and len(built) == 2


def test_a_linen_walk_is_remembered_until_the_kinds_change(monkeypatch):
    walker = zoo.libraries.library("linen").walker
    model = from_canonical(zoo.canonical_init(CFG), CFG, "linen")
    traced = []
    real = type(walker)._modules
    monkeypatch.setattr(type(walker), "_modules",
                        lambda self, *a: traced.append(1) or real(self, *a))
    facts = walk_facts(CFG, "linen")
    walker._walks.clear()
    found = canonical.layers(model, "linen", **facts)
    assert canonical.layers(model, "linen", **facts) == found and len(traced) == 1
    # Other variable shapes are another walk (a wider CNN), as is a change of the kinds.
    wider = zoo.tiny_config("cnn", features=(4, 8))
    canonical.layers(from_canonical(zoo.canonical_init(wider), wider, "linen"), "linen",
                     **walk_facts(wider, "linen"))
    assert len(traced) == 2
    kind = KINDS["linear"]
    register_kind(kind)
    try:
        assert canonical.layers(model, "linen", **facts) == found and len(traced) == 3
    finally:
        register_kind(kind)
    # What a caller does to the list it got does not reach the next caller.
    found.clear()
    assert canonical.layers(model, "linen", **facts)


def test_the_remembered_paths_convert_exactly():
    """Through the memos, a model converts the same both ways in every library (each built
    twice: the second from the memos)."""
    state = zoo.canonical_init(CFG)
    for impl in zoo.JAX_IMPLS:
        for _ in range(2):
            back = to_canonical(from_canonical(state, CFG, impl), impl)
            assert back.keys() == state.keys()
            for k in state:
                np.testing.assert_array_equal(np.asarray(back[k]), state[k], err_msg=k)


def test_a_config_that_cannot_be_hashed_is_built_each_time(monkeypatch):
    class Unhashable(type(CFG)):
        __hash__ = None

    cfg = Unhashable(**{f.name: getattr(CFG, f.name) for f in dataclasses.fields(CFG)})
    lib = zoo.libraries.library("eqx")
    zoo.model_class(CFG.arch, "eqx")
    built = []
    real = type(lib).skeleton
    monkeypatch.setattr(type(lib), "skeleton",
                        lambda self, *a: built.append(a) or real(self, *a))
    first, second = skeleton(cfg, "eqx"), skeleton(cfg, "eqx")
    assert len(built) == 2 and first is not second
