"""GPT-2, the Llama, Gemma and Phi-3 families equal `transformers` in all four libraries, on every
variant of the issues (tests/lm_reference.py: GPT-2 tied and untied; Llama with grouped-query
attention and Llama 3's rope scaling, untied; Mistral's sliding window; Qwen2's q/k/v biases,
tied; Qwen3's q/k norm, own head size and biases, tied; Gemma 1, tied; Gemma 2's post-norms,
soft-capping and sliding / full layers, untied; Gemma 3's q/k norms and per-layer-type rotary
bases, tied; Phi-3's fused qkv_proj and gate_up_proj with a sliding window, untied, and with
partial rotary, tied), each a small config of the `transformers` model
with random weights, float32, eager attention:

- the canonical keys of every library in transformers' `state_dict()` order (less a tied
  head's alias);

- logits within 1e-5 of the largest (the issue's relative measure), unpadded and on a
  left-padded batch (attention mask, position ids), whose padded rows also give the logits of
  the rows alone;
- one `zoo.runtime.fast` training step (next-token loss, padding ignored) in each JAX library equal
to PyTorch's gradients: SGD with learning rate 1 moves each parameter by minus its gradient, so
  the step checks the gradient of every parameter and the loss (equal to transformers' own
  `labels=` loss) at once;
- the native calls, `zoo.runtime.fast.forward` with the other inputs, dropout, the tied head's
alias;
- each option of the Gemma variants changes their logits (the variants exercise them).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import optax
import pytest

import converters
import zoo
from canonical import ConversionError
from tests.lm_reference import (
    PADDING,
    VARIANTS,
    hf_logits,
    hf_model,
    hf_state,
    padded_batch,
    relative,
    variants,
)
from zoo.runtime import fast
from zoo.runtime.training import IGNORE, next_token
from zoo.testing import assert_close, tolerance

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
RELATIVE = 1e-5  # the bound: the largest difference over the largest logit
TOL = tolerance("float32")


@functools.cache
def _model(name: str, impl: str):
    """The zoo model of `impl` holding the transformers model's state_dict (its tied head's
    `lm_head.weight` alias included: dropped as equal)."""
    return converters.from_canonical(hf_state(name), VARIANTS[name], impl)


@functools.cache
def _logits(name: str, impl: str) -> tuple[np.ndarray, np.ndarray]:
    """(unpadded logits, left-padded logits) of the padded batch's ids, canonical layout."""
    cfg = VARIANTS[name]
    ids, mask, pos = padded_batch(cfg)
    model = _model(name, impl)
    if impl == "torch":
        with torch.no_grad():
            t = [torch.from_numpy(a) for a in (ids, mask, pos)]
            return model(t[0]).numpy(), model(*t).numpy()
    api = zoo.interface(impl)
    static, params, state = api.split(model)

    @jax.jit
    def run(params, state, ids, mask, pos):
        plain = api.apply(static, params, state, ids)[0]
        padded = api.apply(static, params, state, ids, attention_mask=mask, position_ids=pos)[0]
        return plain, padded

    native = (api.to_native(a, cfg) for a in (ids, mask, pos))
    return tuple(np.asarray(api.to_canonical(y, cfg)) for y in run(params, state, *native))


@pytest.mark.parametrize("name", variants())
def test_canonical_keys_are_transformers_state_dict_keys_in_its_order(name):
    want = [k for k in hf_state(name) if k not in {t.alias for t in VARIANTS[name].ties}]
    for impl in zoo.IMPLS:
        assert list(converters.to_canonical(_model(name, impl), impl)) == want, impl


@pytest.mark.parametrize("impl", zoo.IMPLS)
@pytest.mark.parametrize("name", variants())
def test_logits_equal_transformers(name, impl):
    cfg = VARIANTS[name]
    ids, mask, pos = padded_batch(cfg)
    plain, padded = _logits(name, impl)
    assert plain.shape == (len(PADDING), cfg.length, cfg.vocab_size)
    assert relative(plain, hf_logits(name, ids)) <= RELATIVE
    valid = mask.astype(bool)
    assert relative(padded[valid], hf_logits(name, ids, mask, pos)[valid]) <= RELATIVE
    for row, pad in enumerate(PADDING):  # each left-padded row: its logits alone, unpadded
        alone = hf_logits(name, ids[row:row + 1, pad:])[0]
        assert relative(padded[row, pad:], alone) <= RELATIVE, row
        if pad:
            assert not np.allclose(padded[row, pad:], plain[row, pad:], **TOL)


def _labels(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask.astype(bool), ids, IGNORE).astype(np.int32)


@functools.cache
def _one_step(name: str, impl: str) -> tuple[float, dict[str, np.ndarray]]:
    """The next-token loss of the padded batch and the canonical parameters after one SGD step
    of learning rate 1 (`zoo.runtime.fast.train_step`; PyTorch: its autograd gradients
    subtracted)."""
    cfg = VARIANTS[name]
    ids, mask, pos = padded_batch(cfg, seed=1)
    labels = _labels(ids, mask)
    if impl == "torch":
        import torch.nn.functional as F

        model = _model(name, impl).train()
        y = model(*(torch.from_numpy(a) for a in (ids, mask, pos)))
        loss = F.cross_entropy(y[:, :-1].flatten(0, 1), torch.from_numpy(labels[:, 1:]).flatten()
                               .long(), ignore_index=IGNORE)
        loss.backward()
        after = {k: (p - p.grad).detach().numpy() for k, p in model.named_parameters()}
        return loss.item(), after
    step = fast.train_step(_model(name, impl), impl, optax.sgd(1.0), next_token)
    api = zoo.interface(impl)
    loss = step(*(api.to_native(a, cfg) for a in (ids, labels)),
                attention_mask=api.to_native(mask, cfg), position_ids=api.to_native(pos, cfg))
    after = converters.to_canonical(step.model(), impl)
    return float(loss), {k: np.asarray(v) for k, v in after.items()}


@pytest.mark.full_only  # --quick: the registry-wide tests step the tiny Llama in every library
@pytest.mark.parametrize("name", VARIANTS)
def test_one_training_step_and_every_gradient_agree_in_the_four_libraries(name):
    cfg = VARIANTS[name]
    ids, mask, pos = padded_batch(cfg, seed=1)
    with torch.no_grad():
        inputs = dict(zip(("input_ids", "attention_mask", "position_ids", "labels"),
                          (torch.from_numpy(a).long() for a in (ids, mask, pos,
                                                                  _labels(ids, mask))),
                          strict=True))
        want = hf_model(name)(**inputs).loss.item()
    before = {k: np.asarray(v) for k, v in converters.to_canonical(
        _model(name, "nnx"), "nnx").items()}
    loss_t, after_t = _one_step(name, "torch")
    assert_close(loss_t, want)  # transformers' own loss for labels=
    dead = [k for k in before if "weight" in k and not np.abs(before[k] - after_t[k]).max()]
    assert not dead, f"parameters without a gradient prove nothing: {dead}"
    for impl in zoo.JAX_IMPLS:
        loss, after = _one_step(name, impl)
        assert_close(loss, want, err_msg=impl)
        assert after.keys() == after_t.keys(), impl
        grads = {k: before[k] - after[k] for k in after}  # the gradients, as computed
        assert_close(grads, {k: before[k] - after_t[k] for k in after})


@pytest.mark.full_only
@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_native_calls_and_zoo_fast_take_the_mask_and_positions(impl):
    """Each library's own call (Equinox: one sequence; Linen: `apply`; NNX and PyTorch: the
    module) and `zoo.runtime.fast.forward` give the padded logits."""
    name = "qwen2-bias-tied"
    cfg = VARIANTS[name]
    ids, mask, pos = padded_batch(cfg)
    want = _logits(name, "torch")[1]
    model = _model(name, impl)
    if impl == "eqx":  # one sequence per call
        import equinox as eqx

        call = eqx.filter_jit(lambda m, *a: m(a[0], attention_mask=a[1], position_ids=a[2]))
        got = [call(model, ids[i], mask[i], pos[i]) for i in range(len(PADDING))]
    elif impl == "linen":
        got = jax.jit(lambda v, *a: model[0].apply(v, a[0], attention_mask=a[1],
                                                   position_ids=a[2]))(model[1], ids, mask, pos)
    elif impl == "nnx":
        from flax import nnx

        got = nnx.jit(lambda m, *a: m(a[0], attention_mask=a[1], position_ids=a[2]))(
            model, ids, mask, pos)
    else:
        with torch.no_grad():
            got = model(*(torch.from_numpy(a) for a in (ids, mask, pos))).numpy()
    valid = mask.astype(bool)
    assert relative(np.asarray(got)[valid], want[valid]) <= RELATIVE
    if impl != "torch":
        got = fast.forward(model, impl)(ids, attention_mask=mask, position_ids=pos)
        assert relative(np.asarray(got)[valid], want[valid]) <= RELATIVE


@pytest.mark.full_only
@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_gpt2_dropout_is_off_in_eval_keyed_and_on_in_training(impl):
    cfg = zoo.tiny_config("gpt2", embd_pdrop=0.1, attn_pdrop=0.1, resid_pdrop=0.1)
    state = zoo.canonical_init(cfg, seed=2)
    ids = padded_batch(cfg)[0]
    off = converters.from_canonical(state, zoo.tiny_config("gpt2"), "torch")
    with torch.no_grad():
        want = off(torch.from_numpy(ids)).numpy()
    model = converters.from_canonical(state, cfg, impl)
    if impl == "torch":
        with torch.no_grad():
            assert_close(model.eval()(torch.from_numpy(ids)).numpy(), want)
            assert not np.allclose(model.train()(torch.from_numpy(ids)).numpy(), want, **TOL)
        return
    api = zoo.interface(impl)
    static, params, st = api.split(model)
    run = jax.jit(lambda k: api.apply(static, params, st, ids, train=True, key=k)[0])
    assert_close(fast.forward(model, impl)(ids), want)
    a, b = run(jax.random.key(0)), run(jax.random.key(1))
    assert not np.allclose(a, want, **TOL) and not np.allclose(a, b, **TOL)
    np.testing.assert_array_equal(run(jax.random.key(0)), a)


def test_the_tied_heads_alias_loads_when_equal_and_is_refused_by_name_otherwise():
    state = hf_state("gpt2")
    assert "lm_head.weight" in state  # transformers lists it beside the embedding
    cfg = VARIANTS["gpt2"]
    assert "lm_head.weight" not in converters.canonical_spec(cfg)  # one key: the embedding's
    model = converters.from_canonical(state, cfg, "torch")
    assert "lm_head.weight" not in model.state_dict()
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    with pytest.raises(ConversionError, match=r"'lm_head.weight' differs from "
                                              r"'transformer.wte.weight'"):
        converters.from_canonical(state, cfg, "nnx")


def test_gpt2_refuses_more_tokens_than_positions_in_one_line():
    cfg = zoo.tiny_config("gpt2")
    model = zoo.create(cfg, "nnx")
    with pytest.raises(zoo.ConfigError, match=r"^gpt2 expects \(L\) per sample \(1 <= L <= 16\)"
                                              r", got \(17,\)"):
        model(np.zeros((1, 17), np.int32))


@pytest.mark.full_only
@pytest.mark.parametrize(("name", "change"), [
    ("gemma2-softcap-window", {"attn_logit_softcapping": None}),
    ("gemma2-softcap-window", {"final_logit_softcapping": None}),
    ("gemma2-softcap-window", {"layer_types": None, "sliding_window": None}),
    ("gemma2-softcap-window", {"query_pre_attn_scalar": None}),
    ("gemma3-qk-norm-local-rope", {"rope_local_base_freq": None}),
    ("gemma3-qk-norm-local-rope", {"rope_type": "default"}),
])
def test_the_gemma_variants_exercise_their_options(name, change):
    """Each option the Gemma variants check bites at their size: the reference without it
    (same weights) misses transformers' logits by far more than the bound."""
    import dataclasses

    cfg = VARIANTS[name]
    ids = padded_batch(cfg)[0]
    model = converters.from_canonical(hf_state(name), dataclasses.replace(cfg, **change),
                                      "torch")
    with torch.no_grad():
        got = model(torch.from_numpy(ids)).numpy()
    assert relative(got, hf_logits(name, ids)) > 1e-3


def test_list_models_finds_the_language_models():
    assert zoo.list_models("qwen*") == ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b",
                                        "qwen3-0.6b", "qwen3-1.7b", "qwen3-235b-a22b",
                                        "qwen3-30b-a3b", "qwen3-8b"]
    assert zoo.list_models("mixtral*") == ["mixtral", "mixtral-8x22b-v0.1", "mixtral-8x7b-v0.1"]
    assert zoo.list_models("gemma*") == ["gemma", "gemma-2-27b", "gemma-2-2b", "gemma-2-9b",
                                         "gemma-2b", "gemma-3-12b", "gemma-3-1b", "gemma-3-27b",
                                         "gemma-3-4b", "gemma-7b"]
    assert zoo.list_models("gpt2*") == ["gpt2", "gpt2-large", "gpt2-medium", "gpt2-xl"]
    assert zoo.list_models("phi*") == ["phi-3-medium-4k", "phi-3-mini-4k", "phi3"]
    assert {"llama-3.2-1b", "llama-3.1-8b", "mistral-7b-v0.1"} <= set(zoo.list_models())
