"""LoRA in every library (matched with `peft` on transformers' models), adapters through PEFT's
files both ways, and trainable / frozen partitions in `zoo.fast`."""

from __future__ import annotations

import functools

import jax
import numpy as np
import optax
import pytest

import zoo
from zoo import fast
from zoo.partition import Partition
from zoo.training import next_token

JAX_IMPLS = ("eqx", "linen", "nnx")


@functools.cache
def tokens(config: zoo.Config, batch: int = 2) -> np.ndarray:
    rng = np.random.default_rng(1)
    return rng.integers(0, config.vocab_size, (batch, config.seq_len)).astype(np.int32)


def unchanged(before, after, impl) -> list[bool]:
    """Per parameter (leaf order), whether `after`'s array is bitwise `before`'s."""
    api = zoo.interface(impl)
    old, new = (jax.tree.leaves(api.split(m)[1]) for m in (before, after))
    return [bool(np.array_equal(a, b)) for a, b in zip(old, new, strict=True)]


@pytest.mark.parametrize("impl", JAX_IMPLS)
def test_a_partition_trains_its_part_and_leaves_the_rest_bitwise(impl):
    config = zoo.tiny_config("gpt2")
    model = zoo.create(config, impl, seed=0)
    api = zoo.interface(impl)
    names = api.leaf_names(*api.split(model)[:2])
    trainable = Partition.freezing_blocks(1)
    step = fast.train_step(model, impl, optax.adam(1e-2), next_token, trainable=trainable,
                           steps_per_call=2)
    x = np.stack([tokens(config)] * 2)
    step(x, x)
    same = unchanged(model, step.model(), impl)
    assert same == [not trainable(n) for n in names]
    assert any(same) and not all(same)


def test_partition_names_are_one_form_in_every_library():
    config = zoo.tiny_config("gpt2")
    named = {}
    for impl in JAX_IMPLS:
        api = zoo.interface(impl)
        named[impl] = {n.rsplit(".", 1)[0] for n in api.leaf_names(
            *api.split(zoo.create(config, impl, seed=0))[:2])}
    assert named["eqx"] == named["linen"] == named["nnx"]
    assert "transformer.h.1.attn.c_attn" in named["linen"]


def test_a_partition_that_trains_nothing_is_refused_in_one_line():
    model = zoo.create(zoo.tiny_config("gpt2"), "nnx", seed=0)
    with pytest.raises(ValueError, match="trains none of the") as e:
        fast.train_step(model, "nnx", optax.sgd(0.1), next_token,
                        trainable=Partition.only("no_such.*"))
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="non-empty name patterns"):
        Partition.only()
