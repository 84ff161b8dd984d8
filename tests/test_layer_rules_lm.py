"""The language models' layer rules against `transformers` (docs/conventions.md).

- `rms_norm`: transformers' `LlamaRMSNorm` weights in the zoo's RMSNorm of every library (and
  the libraries' own classes, which the kind covers), equal outputs, float32 and bfloat16.
- `offset_rms_norm`: transformers' `GemmaRMSNorm` (times `1 + weight`, in float32, weights
  starting at zero) likewise.
- `hf_conv1d`: transformers' `Conv1D` (`(in, out)` weights) in the zoo's Conv1D of every
  library; the linear rule on the same arrays is wrong (a square layer runs and differs).
- ties: a tied alias equal to its source is dropped, an unequal one refused by name.
- the rotary embedding: transformers' half-split convention and its inverse frequencies (Llama
  3's included); Meta's interleaved pairing of the same weights gives other logits, so the
  zoo never permutes q/k rows.
- the causal mask and grouped-query attention against transformers' eager attention with its
  own mask (padding, sliding window).
"""

from __future__ import annotations

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import canonical
from canonical import KINDS, ConversionError, Layer, Tie
from zoo.layers import eqx as zeqx
from zoo.layers import linen as zlinen
from zoo.layers import nnx as znnx
from zoo.layers.causal import attend, causal_mask, rope_frequencies, rotary
from zoo.testing import assert_close, tolerance

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
TOL = tolerance("float32")


def _native(kind: str, family: str, canonical_arrays: dict, layer: Layer) -> dict:
    return KINDS[kind].convert(family, canonical_arrays, layer, to="native")


def _back(kind: str, family: str, native: dict, layer: Layer) -> dict:
    return KINDS[kind].convert(family, native, layer, to="canonical")


# --------------------------------------------------------------------------- RMSNorm
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rms_norm_rule_matches_transformers(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    c, eps = 6, 1e-5
    ref = LlamaRMSNorm(c, eps=eps)
    with torch.no_grad():
        ref.weight.copy_(torch.linspace(0.5, 1.5, c))
    tdt = getattr(torch, dtype)
    ref = ref.to(tdt)
    x = torch.randn(3, 4, c, generator=torch.Generator().manual_seed(0)).to(tdt) * 3 + 1
    want = ref(x).detach().float().numpy()
    weight = {"weight": ref.weight.detach().float().numpy().astype(jnp.dtype(dtype))}
    layer = Layer("norm", "rms_norm")
    xj = jnp.asarray(x.float().numpy(), dtype)

    eqx_norm = eqx.tree_at(lambda m: m.weight, zeqx.RMSNorm(c, eps=eps, use_bias=False,
                                                           dtype=dtype),
                           jnp.asarray(_native("rms_norm", "eqx", weight, layer)["weight"]))
    got = {"eqx": jax.vmap(jax.vmap(eqx_norm))(xj)}
    flax_arrays = _native("rms_norm", "flax", weight, layer)
    assert set(flax_arrays) == {"scale"}
    got["linen"] = zlinen.RMSNorm(epsilon=eps, param_dtype=dtype).apply(
        {"params": flax_arrays}, xj)
    model = znnx.RMSNorm(c, epsilon=eps, param_dtype=dtype, rngs=nnx.Rngs(0))
    model.scale.set_value(jnp.asarray(flax_arrays["scale"]))
    got["nnx"] = model(xj)
    for impl, y in got.items():
        assert y.dtype == jnp.dtype(dtype), impl
        assert_close(np.asarray(y, np.float32), want, dtype, err_msg=impl)
    assert _back("rms_norm", "flax", flax_arrays, layer).keys() == {"weight"}


def test_rms_norm_kind_covers_the_libraries_own_classes():
    for cls, impl in ((eqx.nn.RMSNorm, "eqx"), (nn.RMSNorm, "linen"), (nnx.RMSNorm, "nnx"),
                      (torch.nn.RMSNorm, "torch"), (zeqx.RMSNorm, "eqx"),
                      (zlinen.RMSNorm, "linen"), (znnx.RMSNorm, "nnx")):
        assert canonical.kind_of(object.__new__(cls), impl).name == "rms_norm", cls


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_offset_rms_norm_rule_matches_transformers_gemma_norm(dtype):
    """`offset_rms_norm`: transformers' `GemmaRMSNorm` (times `1 + weight`, in float32) in the
    zoo's OffsetRMSNorm of every library and PyTorch's reference; weights start at zero."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    from zoo.layers.torch import OffsetRMSNorm

    c, eps = 6, 1e-6
    tdt = getattr(torch, dtype)
    ref = GemmaRMSNorm(c, eps=eps)
    assert not ref.weight.detach().any()  # transformers starts at zero, so do the zoo's
    with torch.no_grad():
        ref.weight.copy_(torch.linspace(-0.5, 0.5, c))
    ref = ref.to(tdt)
    x = torch.randn(3, 4, c, generator=torch.Generator().manual_seed(0)).to(tdt) * 3 + 1
    want = ref(x).detach().float().numpy()
    weight = {"weight": ref.weight.detach().float().numpy().astype(jnp.dtype(dtype))}
    layer = Layer("norm", "offset_rms_norm")
    xj = jnp.asarray(x.float().numpy(), dtype)
    eqx_norm = zeqx.OffsetRMSNorm(c, eps=eps, dtype=dtype)
    assert not np.asarray(eqx_norm.weight).any()
    eqx_norm = eqx.tree_at(lambda m: m.weight, eqx_norm, jnp.asarray(
        _native("offset_rms_norm", "eqx", weight, layer)["weight"]))
    got = {"eqx": jax.vmap(jax.vmap(eqx_norm))(xj)}
    flax_arrays = _native("offset_rms_norm", "flax", weight, layer)
    assert set(flax_arrays) == {"scale"}
    linen = zlinen.OffsetRMSNorm(epsilon=eps, param_dtype=dtype)
    assert not np.asarray(linen.init(jax.random.key(0), xj)["params"]["scale"]).any()
    got["linen"] = linen.apply({"params": flax_arrays}, xj)
    model = znnx.OffsetRMSNorm(c, epsilon=eps, param_dtype=dtype)
    assert not np.asarray(model.scale[...]).any()
    model.scale.set_value(jnp.asarray(flax_arrays["scale"]))
    got["nnx"] = model(xj)
    mine = OffsetRMSNorm(c, eps=eps).to(tdt)
    assert not mine.weight.detach().any()
    mine.load_state_dict(ref.state_dict())
    out = mine(x)
    assert out.dtype == tdt
    np.testing.assert_array_equal(out.detach().float().numpy(), want)  # the same arithmetic
    for impl, y in got.items():
        assert y.dtype == jnp.dtype(dtype), impl
        assert_close(np.asarray(y, np.float32), want, dtype, err_msg=impl)
    assert _back("offset_rms_norm", "flax", flax_arrays, layer).keys() == {"weight"}
    for cls, impl in ((zeqx.OffsetRMSNorm, "eqx"), (zlinen.OffsetRMSNorm, "linen"),
                      (znnx.OffsetRMSNorm, "nnx"), (OffsetRMSNorm, "torch")):
        assert canonical.kind_of(object.__new__(cls), impl).name == "offset_rms_norm", cls


# --------------------------------------------------------------------------- Conv1D
def _transformers_conv1d(n_in: int, n_out: int):
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    ref = Conv1D(n_out, n_in)
    with torch.no_grad():
        ref.bias.copy_(torch.randn(n_out))
    return ref


@pytest.mark.parametrize(("n_in", "n_out"), [(4, 12), (5, 5)])
def test_conv1d_rule_matches_transformers(n_in, n_out):
    ref = _transformers_conv1d(n_in, n_out)
    arrays = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    assert arrays["weight"].shape == (n_in, n_out)  # (in, out): the canonical layout
    x = np.random.default_rng(1).standard_normal((2, 3, n_in)).astype(np.float32)
    want = ref(torch.from_numpy(x)).detach().numpy()
    layer = Layer("c_attn", "hf_conv1d")
    e = _native("hf_conv1d", "eqx", arrays, layer)
    f = _native("hf_conv1d", "flax", arrays, layer)
    assert e["weight"].shape == (n_out, n_in) and f["kernel"].shape == (n_in, n_out)
    conv = zeqx.Conv1D(n_in, n_out, key=jax.random.key(0))
    conv = eqx.tree_at(lambda m: (m.weight, m.bias), conv,
                       (jnp.asarray(e["weight"]), jnp.asarray(e["bias"])))
    got = {"eqx": jax.vmap(jax.vmap(conv))(x),
           "linen": zlinen.Conv1D(n_out).apply({"params": f}, x)}
    model = znnx.Conv1D(n_in, n_out, rngs=nnx.Rngs(0))
    model.kernel.set_value(jnp.asarray(f["kernel"]))
    model.bias.set_value(jnp.asarray(f["bias"]))
    got["nnx"] = model(x)
    for impl, y in got.items():
        assert_close(np.asarray(y), want, err_msg=impl)
    for family, native in (("eqx", e), ("flax", f)):  # exact inverses
        back = _back("hf_conv1d", family, native, layer)
        assert all(np.asarray(back[k]).tobytes() == arrays[k].tobytes() for k in arrays)
    if n_in == n_out:  # the linear rule would transpose: a square layer runs, and is wrong
        wrong = _native("linear", "flax", arrays, Layer("c_attn", "linear"))
        y = zlinen.Conv1D(n_out).apply({"params": wrong}, x)
        assert not np.allclose(np.asarray(y), want, **TOL)


def test_zoo_conv1d_classes_have_their_kind():
    from zoo.layers import torch as ztorch

    for cls, impl in ((zeqx.Conv1D, "eqx"), (zlinen.Conv1D, "linen"), (znnx.Conv1D, "nnx"),
                      (ztorch.Conv1D, "torch")):
        assert canonical.kind_of(object.__new__(cls), impl).name == "hf_conv1d", cls


# --------------------------------------------------------------------------- ties
def test_ties_drop_an_equal_alias_and_refuse_an_unequal_one_by_name():
    ties = (Tie("lm_head.weight", "wte.weight"),)
    w = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    state = {"wte.weight": w, "h.bias": np.zeros(2, np.float32), "lm_head.weight": w.copy()}
    assert list(canonical.untie(state, ties)) == ["wte.weight", "h.bias"]
    assert list(canonical.untie({"lm_head.weight": w, "h.bias": w[0]}, ties)) == [
        "wte.weight", "h.bias"]  # the alias alone stands for its source
    with pytest.raises(ConversionError, match=r"'lm_head.weight' differs from 'wte.weight'"):
        canonical.untie({**state, "lm_head.weight": w + 1}, ties)
    tied = canonical.tie(canonical.untie(state, ties), ties)
    assert tied["lm_head.weight"] is tied["wte.weight"]


# --------------------------------------------------------------------------- rotary
def _hf_rotary(config_kwargs: dict):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(LlamaConfig(**config_kwargs))


@pytest.mark.parametrize("scaling", [None, {"rope_type": "llama3", "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 64}])
def test_rotary_frequencies_and_rotation_are_transformers(scaling):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    d = 16
    hf = _hf_rotary({"hidden_size": 4 * d, "num_attention_heads": 4, "head_dim": d,
                     "rope_theta": 50000.0, "rope_scaling": scaling})
    kind = "default" if scaling is None else "llama3"
    inv = rope_frequencies(d, 50000.0, kind, 8.0, 1.0, 4.0, 64)
    # tolerance: one power per element, no reduction: within 2 ulps of transformers'
    # tolerance: float32 powers of the base, computed in another order: an ulp or two
    np.testing.assert_allclose(inv, hf.inv_freq.numpy(), rtol=2e-7, atol=0)
    if scaling is not None:  # all three bands are there: kept, smoothed, divided
        ratio = inv / rope_frequencies(d, 50000.0)
        assert ratio.max() == 1 and np.isclose(ratio.min(), 1 / 8) and np.any(
            (ratio > 1 / 8 + 1e-6) & (ratio < 1 - 1e-6))
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 5, 3, d)).astype(np.float32)  # (N, L, heads, D)
    pos = np.array([[0, 1, 2, 3, 4], [7, 3, 0, 11, 100]])
    cos, sin = hf(torch.zeros(1), torch.from_numpy(pos))
    qt = torch.from_numpy(q).transpose(1, 2)
    want = apply_rotary_pos_emb(qt, qt, cos, sin)[0].transpose(1, 2).numpy()
    got = rotary(jnp.asarray(q), jnp.asarray(pos), inv)
    assert_close(np.asarray(got), want)


@pytest.mark.parametrize("factor", [0.5, 0.75])
def test_partial_rotary_is_transformers(factor):
    """Frequencies of `partial_rotary_factor * head_dim` dimensions rotate those leading
    dimensions of each head and pass the others through, as transformers' Phi-3 does."""
    from transformers import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

    from zoo.layers.torch import rotary as torch_rotary

    d = 16
    hf = Phi3RotaryEmbedding(Phi3Config(hidden_size=4 * d, num_attention_heads=4,
                                        rope_theta=100.0, partial_rotary_factor=factor))
    inv = rope_frequencies(int(d * factor), 100.0)
    # tolerance: float32 powers of the base, computed in another order: an ulp or two
    np.testing.assert_allclose(inv, hf.inv_freq.numpy(), rtol=2e-7, atol=0)
    q = np.random.default_rng(0).standard_normal((2, 5, 3, d)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [7, 3, 0, 11, 100]])
    cos, sin = hf(torch.zeros(1), torch.from_numpy(pos))
    qt = torch.from_numpy(q).transpose(1, 2)
    want = apply_rotary_pos_emb(qt, qt, cos, sin)[0].transpose(1, 2).numpy()
    assert_close(np.asarray(rotary(jnp.asarray(q), jnp.asarray(pos), inv)), want)
    got = torch_rotary(qt, torch.from_numpy(pos), inv).transpose(1, 2).numpy()
    assert_close(got, want)
    assert np.array_equal(want[..., int(d * factor):], q[..., int(d * factor):])


def _meta_interleaved(w: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows in Meta's original layout (pairs `(2i, 2i + 1)`), the inverse of the permutation
    transformers' `convert_llama_weights_to_hf.py` applies."""
    out, inp = w.shape
    d = out // heads
    return w.reshape(heads, 2, d // 2, inp).transpose(0, 2, 1, 3).reshape(out, inp)


def test_half_split_rotary_needs_no_permutation_and_an_interleaved_one_fails():
    """transformers' weights give transformers' logits as they are; the same weights with q/k
    rows permuted to Meta's interleaved pairing do not (a converter that permuted would be
    wrong), so the convention is pinned."""
    import converters
    import zoo

    cfg = zoo.tiny_config("llama", num_hidden_layers=1, rope_type="default", rope_theta=100.0)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=1,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.kv_heads,
        rope_theta=100.0, attn_implementation="eager")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    state = {k: v.numpy() for k, v in hf.state_dict().items()}
    ids = np.arange(8, dtype=np.int32)[None] * 5 % cfg.vocab_size
    with torch.no_grad():
        want = hf(torch.from_numpy(ids).long()).logits.numpy()

    def logits(s):
        api = zoo.interface("nnx")
        static, params, st = api.split(converters.from_canonical(s, cfg, "nnx"))
        return np.asarray(api.apply(static, params, st, jnp.asarray(ids))[0])

    assert_close(logits(state), want)
    permuted = dict(state)
    for name, heads in (("q_proj", cfg.num_attention_heads), ("k_proj", cfg.kv_heads)):
        key = f"model.layers.0.self_attn.{name}.weight"
        permuted[key] = _meta_interleaved(state[key], heads)
    assert not np.allclose(logits(permuted), want, **TOL)


# --------------------------------------------------------------------------- mask, attention
@pytest.mark.parametrize("window", [None, 3])
def test_causal_mask_and_grouped_attention_match_transformers_eager(window):
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
    from transformers.models.llama.modeling_llama import eager_attention_forward

    n, length, heads, kv, d = 2, 6, 4, 2, 3
    hf_cfg = transformers.MistralConfig(hidden_size=heads * d, num_attention_heads=heads,
                                        num_key_value_heads=kv, sliding_window=window,
                                        attn_implementation="eager")
    mask2d = np.ones((n, length), np.int64)
    mask2d[1, :2] = 0  # left padding
    make = create_causal_mask if window is None else create_sliding_window_causal_mask
    embeds = torch.zeros(n, length, heads * d)
    hf_mask = make(config=hf_cfg, inputs_embeds=embeds, attention_mask=torch.from_numpy(mask2d),
                   cache=None, position_ids=torch.arange(length)[None])
    rng = np.random.default_rng(0)
    q = rng.standard_normal((n, length, heads, d)).astype(np.float32)
    k, v = (rng.standard_normal((n, length, kv, d)).astype(np.float32) for _ in range(2))

    class Module(torch.nn.Module):
        num_key_value_groups = heads // kv
        training = False

    want, _ = eager_attention_forward(Module(), *(torch.from_numpy(a).transpose(1, 2)
                                                  for a in (q, k, v)), hf_mask, scaling=d ** -0.5)
    index = jnp.arange(length)
    mask = causal_mask(index, index, jnp.asarray(mask2d), window)
    np.testing.assert_array_equal(np.asarray(mask), (hf_mask == 0).numpy()[:, 0])
    got = attend(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), mask, d ** -0.5)
    valid = mask2d.astype(bool)  # a padding query sees no key: its output is never read
    assert_close(np.asarray(got)[valid], want.numpy()[valid])
    assert np.isfinite(np.asarray(got)).all()
