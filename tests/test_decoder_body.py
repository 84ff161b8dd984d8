"""The shared decoder body (`zoo.models.decoder`): every library offers the same kinds, a
spec names one module per role of a block (the post-norms at most once), and its per-layer
attention types name known types, one per layer; a mixture of experts is an MLP kind, and layers
may differ in their MLP. (Its numbers are checked through GPT-2, the Llama, the Gemma and the
mixture-of-experts families in tests/test_language_models.py and tests/test_generation.py.)"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

import zoo
from zoo.models.decoder import AttentionSpec, LayerAttention, MLPSpec, MoESpec, Names
from zoo.models.decoder.spec import DecoderSpec
from zoo.models.llama.config import LlamaConfig
from zoo.testing import assert_close

LIBRARIES = ("eqx", "linen", "nnx", "torch")


@pytest.mark.parametrize("table", ["NORMS", "MLPS", "BLOCKS"])
def test_every_library_offers_the_same_kinds(table):
    pytest.importorskip("torch")
    kinds = {lib: sorted(getattr(importlib.import_module(f"zoo.models.decoder.{lib}"), table))
             for lib in LIBRARIES}
    assert len({tuple(k) for k in kinds.values()}) == 1, kinds


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gemma", "phi3", "mixtral"])
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


@dataclasses.dataclass(frozen=True)
class _FusedLlama(LlamaConfig):
    """The Llama family's config with Phi-3's fused layouts: `qkv_proj` and `gate_up_proj`."""

    @property
    def decoder(self) -> DecoderSpec:
        spec = super().decoder
        return dataclasses.replace(
            spec, attention=dataclasses.replace(spec.attention, layout="qkv_proj"),
            mlp=dataclasses.replace(spec.mlp, kind="gate_up"))


def _fused_state(state: dict) -> dict:
    """A separate-projection state with q, k, v and gate, up stacked along the output."""
    out = {}
    for key, value in state.items():
        head, _, leaf = key.rpartition(".")
        stem, _, name = head.rpartition(".")
        if name in ("q_proj", "gate_proj"):
            parts = (("q_proj", "k_proj", "v_proj") if name == "q_proj"
                     else ("gate_proj", "up_proj"))
            fused = "qkv_proj" if name == "q_proj" else "gate_up_proj"
            out[f"{stem}.{fused}.{leaf}"] = np.concatenate(
                [state[f"{stem}.{p}.{leaf}"] for p in parts])
        elif name not in ("k_proj", "v_proj", "up_proj"):
            out[key] = value
    return out


@pytest.mark.parametrize("impl", LIBRARIES)
def test_fused_qkv_and_gate_up_layouts_equal_the_separate_projections(impl):
    """The `qkv_proj` layout and `gate_up` kind compute what `q/k/v_proj` and `gate/up_proj`
    compute with their weights stacked (grouped key/value heads: q, k, v of unequal widths;
    biases). The decode path is checked on the Phi-3 variants (tests/test_generation.py)."""
    torch = pytest.importorskip("torch")
    import converters

    plain = zoo.tiny_config("llama", rope_type="default", mlp_bias=True,
                            attention_bias=True)
    fused = _FusedLlama(**{f.name: getattr(plain, f.name)
                           for f in dataclasses.fields(plain)})
    assert plain.kv_heads < plain.num_attention_heads
    reference = zoo.create(plain, "torch", seed=3)
    state = {k: v.numpy() for k, v in reference.state_dict().items()}
    model = converters.from_canonical(_fused_state(state), fused, impl)
    assert "model.layers.0.self_attn.qkv_proj.weight" in converters.to_canonical(model, impl)
    ids = np.random.default_rng(0).integers(0, plain.vocab_size, (2, 6)).astype(np.int32)
    with torch.no_grad():
        want = reference(torch.from_numpy(ids).long()).numpy()
    if impl == "torch":
        with torch.no_grad():
            got = model(torch.from_numpy(ids).long()).numpy()
    else:
        api = zoo.interface(impl)
        static, params, state_ = api.split(model)
        got = api.to_canonical(api.apply(static, params, state_, api.to_native(ids, fused))[0],
                               fused)
    assert_close(np.asarray(got), want)


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


_POST_NORM = (("attention.self", "attention"), ("attention.output", "attention_output"),
              ("intermediate", "mlp"), ("output", "mlp_output"))


def test_a_post_norm_block_plays_the_encoder_roles_and_mixes_none():
    names = Names(body="bert", embedding="embeddings.word_embeddings", layers="encoder.layer",
                  norm=None, block=_POST_NORM, token_types="embeddings.token_type_embeddings")
    assert names.residual == "post" and Names(**{**_spec().names.__dict__}).residual == "pre"
    with pytest.raises(ValueError, match="one module per role"):
        Names(body="bert", embedding="e", layers="l", norm=None,
              block=(*_POST_NORM, ("ln", "attention_post_norm")))
    with pytest.raises(ValueError, match="token types need both"):
        DecoderSpec(names, 8, 4, 1, "layer_norm", 1e-12,
                    AttentionSpec("query_key_value", 1, 1, 4), MLPSpec("dense", 8, "gelu"))


def test_padded_positions_are_robertas():
    torch = pytest.importorskip("torch")
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    from zoo.models.decoder.spec import padded_positions

    ids = torch.tensor([[0, 5, 7, 1, 1], [3, 1, 4, 4, 1]])
    want = RobertaEmbeddings.create_position_ids_from_input_ids(ids, padding_idx=1)
    assert torch.equal(padded_positions(ids, 1), want)
    assert (np.asarray(padded_positions(ids.numpy(), 1)) == want.numpy()).all()


def test_a_bidirectional_mask_hides_only_the_padding():
    from zoo.layers.causal import sequence_mask

    valid = np.array([[1, 1, 0]])
    mask = np.asarray(sequence_mask(3, valid, causal=False))
    assert (mask == np.array([[[True, True, False]] * 3])).all()
    assert not np.asarray(sequence_mask(3, valid))[0, 0, 1]  # causal: the future hidden


def test_the_pooled_token_is_transformers_choice():
    """`PoolSpec.index`: BERT's first token, SigLIP's last, CLIP's first EOS and, for its
    configs of `eos_token_id` 2, the highest id; the same on NumPy and PyTorch arrays."""
    torch = pytest.importorskip("torch")
    from zoo.models.decoder import PoolSpec

    ids = np.array([[5, 9, 2, 0, 0], [5, 7, 8, 2, 2]])
    assert PoolSpec().index(ids) == 0 and PoolSpec("last").index(ids) == -1
    assert PoolSpec("eos", eos_token_id=2).index(ids).tolist() == [2, 3]
    assert PoolSpec("max_id").index(ids).tolist() == [1, 2]
    assert PoolSpec("eos", eos_token_id=2).index(torch.from_numpy(ids)).tolist() == [2, 3]
    with pytest.raises(ValueError, match="needs eos_token_id"):
        PoolSpec("eos")
    with pytest.raises(ValueError, match="pass input_ids"):
        PoolSpec("max_id").index(None)
