"""The shared decoder body (`zoo.models.decoder`): every library offers the same kinds, a
spec names one module per role of a block (the post-norms at most once), and its per-layer
attention types name known types, one per layer; a mixture of experts is an MLP kind, and layers
may differ in their MLP. (Its numbers are checked through GPT-2, the Llama, the Gemma and the
mixture-of-experts families in tests/test_language_models.py and tests/test_generation.py.)"""

from __future__ import annotations

import importlib

import pytest

import zoo
from zoo.models.decoder import AttentionSpec, LayerAttention, MLPSpec, MoESpec, Names
from zoo.models.decoder.spec import DecoderSpec

LIBRARIES = ("eqx", "linen", "nnx", "torch")


@pytest.mark.parametrize("table", ["NORMS", "ATTENTIONS", "MLPS"])
def test_every_library_offers_the_same_kinds(table):
    pytest.importorskip("torch")
    kinds = {lib: sorted(getattr(importlib.import_module(f"zoo.models.decoder.{lib}"), table))
             for lib in LIBRARIES}
    assert len({tuple(k) for k in kinds.values()}) == 1, kinds


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gemma", "mixtral"])
def test_the_families_configure_the_body(arch):
    spec = zoo.tiny_config(arch).decoder
    assert isinstance(spec, DecoderSpec)
    hash(spec)  # static in Equinox, a Linen attribute, part of NNX's graph definition


def test_a_block_needs_one_module_per_role():
    with pytest.raises(ValueError, match="one module per role"):
        Names(body="model", embedding="embed", layers="layers", norm="norm",
              block=(("attn", "attention"), ("mlp", "mlp"), ("ln", "attention_norm")))


def test_post_norms_are_optional_roles_taken_at_most_once():
    block = (("attn", "attention"), ("mlp", "mlp"), ("ln", "attention_norm"),
             ("post_ln", "attention_post_norm"), ("pre_ff", "mlp_norm"))
    names = Names(body="model", embedding="embed", layers="layers", norm="norm", block=block)
    assert names.has("attention_post_norm") and not names.has("mlp_post_norm")
    with pytest.raises(ValueError, match="at most one per optional role"):
        Names(body="model", embedding="embed", layers="layers", norm="norm",
              block=(*block, ("again", "attention_post_norm")))


def _spec(**kwargs) -> DecoderSpec:
    names = Names(body="model", embedding="embed", layers="layers", norm="norm",
                  block=(("attn", "attention"), ("mlp", "mlp"), ("ln1", "attention_norm"),
                         ("ln2", "mlp_norm")))
    return DecoderSpec(names, 8, 4, 3, "rms_norm", 1e-6, AttentionSpec("qkvo", 1, 1, 4),
                       MLPSpec("gated", 8, "silu"), rope=(1.0, 0.5), **kwargs)


def test_layer_types_give_each_layer_its_window_and_rope():
    types = (("full", LayerAttention(None, (1.0, 0.1))), ("local", LayerAttention(2, (1.0,
                                                                                     0.5))))
    spec = _spec(layer_types=("local", "full", "local"), attention_types=types)
    assert [spec.layer(i).sliding_window for i in range(3)] == [2, None, 2]
    assert spec.windows == (2, None) and spec.layer(1).rope == (1.0, 0.1)
    plain = _spec()  # no types: every layer the attention's window and the spec's rope
    assert plain.layer(2) == LayerAttention(None, (1.0, 0.5)) and plain.windows == (None,)
    for bad in (("local", "full"), ("local", "full", "global")):
        with pytest.raises(ValueError, match="layer_types needs one of"):
            _spec(layer_types=bad, attention_types=types)


def test_a_mixture_of_experts_is_an_mlp_kind_with_per_layer_mlps():
    moe = MLPSpec("moe", 6, "silu", moe=MoESpec(4, 2))
    spec = _spec(layer_mlps=(moe, MLPSpec("gated", 8, "silu"), moe),
                 output_router_logits=True)
    assert spec.sparse_layers == (0, 2) and spec.mlp_of(1).kind == "gated"
    assert _spec().mlp_of(2) == _spec().mlp and not _spec().sparse_layers
    with pytest.raises(ValueError, match="needs moe set exactly when its kind is 'moe'"):
        MLPSpec("moe", 6, "silu")
    with pytest.raises(ValueError, match=r"routes each token to 1 \.\. 4 of them, found top_k 5"):
        MoESpec(4, 5)
    with pytest.raises(ValueError, match=r"layer_mlps needs one MLPSpec per layer \(3\)"):
        _spec(layer_mlps=(moe,))
    with pytest.raises(ValueError, match="output_router_logits needs a layer whose MLP"):
        _spec(output_router_logits=True)
