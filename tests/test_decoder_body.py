"""The shared decoder body (`zoo.models.decoder`): every library offers the same kinds, and a
spec names one module per role of a block. (Its numbers are checked through GPT-2 and the
Llama family in tests/test_language_models.py and tests/test_generation.py.)"""

from __future__ import annotations

import importlib

import pytest

import zoo
from zoo.models.decoder import Names
from zoo.models.decoder.spec import DecoderSpec

LIBRARIES = ("eqx", "linen", "nnx", "torch")


@pytest.mark.parametrize("table", ["NORMS", "ATTENTIONS", "MLPS"])
def test_every_library_offers_the_same_kinds(table):
    pytest.importorskip("torch")
    kinds = {lib: sorted(getattr(importlib.import_module(f"zoo.models.decoder.{lib}"), table))
             for lib in LIBRARIES}
    assert len({tuple(k) for k in kinds.values()}) == 1, kinds


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_families_configure_the_body(arch):
    spec = zoo.tiny_config(arch).decoder
    assert isinstance(spec, DecoderSpec)
    hash(spec)  # static in Equinox, a Linen attribute, part of NNX's graph definition


def test_a_block_needs_one_module_per_role():
    with pytest.raises(ValueError, match="one module per role"):
        Names(body="model", embedding="embed", layers="layers", norm="norm",
              block=(("attn", "attention"), ("mlp", "mlp"), ("ln", "attention_norm")))
