"""`zoo.generate` against `transformers`' `generate`, and the KV caches under it (issue 35).

- greedy decoding of 32 new tokens equal token for token to `transformers`'
  `generate(do_sample=False)` in all four libraries, for GPT-2 and every Llama-, Gemma- and
  Phi-3-family variant
  (tests/lm_reference.py), one prompt and a left-padded batch, with and without EOS stopping;
- sampling with one seed draws the same tokens in the three JAX libraries;
- every library's cached decoding gives the full forward's logits at every position (one
  sliding window; sliding and full layers with their own rotary frequencies; Phi-3's fused
  `qkv_proj` with a window);
- the decode step compiles once (the Python-loop style and the whole loop), and the three
  call styles give the same tokens; `zoo.generate` compiles nothing more over calls with new
  prompts of one bucket, other contents and seeds (tokens still `transformers`');
- Equinox's compiled decode step copies no Linear weight transposed (`zoo.layers.dense`);
- bfloat16 weights and cache: greedy tokens equal to `transformers`' in bfloat16;
- bad input gets a one-line ValueError naming the argument.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import numpy as np
import pytest

import converters
import zoo
from tests.kind_cover import cover
from tests.lm_reference import QUICK, VARIANTS, hf_model_of, padded_batch, relative
from zoo.layers.dense import contract
from zoo.runtime.generation import Settings
from zoo.runtime.generation.loop import Generator, bucket
from zoo.testing import assert_close

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
NEW = 32  # new tokens per test
PROMPT = 6
IMPLS = ("eqx", "linen", "nnx", "torch")
# GPT-2's tiny config has 16 positions: room for the prompt and the new tokens
CONFIGS = {name: dataclasses.replace(cfg, n_positions=64) if cfg.arch == "gpt2" else cfg
           for name, cfg in VARIANTS.items()}
QUICK_NAMES = (QUICK, "gpt2")


def _names() -> list:
    return [n if n in QUICK_NAMES else pytest.param(n, marks=pytest.mark.full_only)
            for n in CONFIGS]


@functools.cache
def _reference(name: str):
    """The transformers model of variant `name` with no EOS of its own (tests give one)."""
    hf = hf_model_of(CONFIGS[name])
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


@functools.cache
def _model(name: str, impl: str):
    state = {k: v.numpy().copy() for k, v in _reference(name).state_dict().items()}
    return converters.from_canonical(state, CONFIGS[name], impl)


def _prompts(name: str) -> tuple[np.ndarray, np.ndarray]:
    """A left-padded batch of three prompts (padding 0, 3, 1)."""
    ids, mask, _ = padded_batch(dataclasses.replace(CONFIGS[name], seq_len=PROMPT), seed=1)
    return ids, mask


def _hf_generate(name: str, ids: np.ndarray, mask: np.ndarray, **kwargs) -> np.ndarray:
    with torch.no_grad():
        out = _reference(name).generate(
            torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long(),
            max_new_tokens=NEW, do_sample=False, **kwargs)
    return out.numpy()


@pytest.mark.parametrize(("name", "impl"), cover(_names(), IMPLS))
def test_greedy_equals_transformers(name: str, impl: str) -> None:
    ids, mask = _prompts(name)
    model = _model(name, impl)
    single = _hf_generate(name, ids[:1], mask[:1])
    np.testing.assert_array_equal(np.asarray(zoo.generate(model, impl, ids[:1],
                                                          max_new_tokens=NEW)), single)
    batch = _hf_generate(name, ids, mask)
    assert batch.shape == (3, PROMPT + NEW)
    # EOS: a token each row of the batch generates (rows stop at different steps)
    eos = [int(batch[0, PROMPT + 4]), int(batch[2, PROMPT + 9])]
    stopped = _hf_generate(name, ids, mask, eos_token_id=eos, pad_token_id=0)
    got = np.asarray(zoo.generate(model, impl, ids, mask, max_new_tokens=NEW,
                                  eos_token_id=eos, pad_token_id=0))
    np.testing.assert_array_equal(got, stopped)
    # rows 0 and 2 stop by their 5th and 10th new token, padded after
    assert (got[0, PROMPT + 5:] == 0).all() and np.isin(got[[0, 2], PROMPT:], eos).any(1).all()


@pytest.mark.full_only
def test_greedy_batch_without_eos_equals_transformers() -> None:
    """The left-padded batch decoding every one of its 32 tokens (no EOS), each library."""
    ids, mask = _prompts(QUICK)
    want = _hf_generate(QUICK, ids, mask)
    for impl in IMPLS:
        got = zoo.generate(_model(QUICK, impl), impl, ids, mask, max_new_tokens=NEW)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=impl)


def test_sampling_same_seed_same_tokens() -> None:
    ids, mask = _prompts(QUICK)
    kw = {"max_new_tokens": 10, "temperature": 0.8, "top_k": 20, "top_p": 0.9}
    drawn = {impl: np.asarray(zoo.generate(_model(QUICK, impl), impl, ids, mask, seed=3, **kw))
             for impl in ("eqx", "linen", "nnx")}
    np.testing.assert_array_equal(drawn["linen"], drawn["eqx"])
    np.testing.assert_array_equal(drawn["nnx"], drawn["eqx"])
    greedy = _hf_generate(QUICK, ids, mask)[:, :PROMPT + 10]
    assert (drawn["eqx"] != greedy).any()  # sampled, not greedy
    sampled = zoo.generate(_model(QUICK, "torch"), "torch", ids, mask, seed=3, **kw)
    assert tuple(sampled.shape) == drawn["eqx"].shape


def _cached_logits(name: str, impl: str, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Logits of the prompt's first 3 tokens at once, then one token per call."""
    n, length = ids.shape
    pos = np.asarray(zoo.models.language.positions(mask), np.int32)
    model = _model(name, impl)
    steps = [slice(0, 3), *(slice(t, t + 1) for t in range(3, length))]
    if impl == "torch":
        cache = model.init_cache(n, length + 2)
        slots = torch.zeros(n, length + 2, dtype=torch.long)
        slots[:, :length] = torch.from_numpy(mask)
        with torch.no_grad():
            return np.concatenate([model(torch.from_numpy(ids[:, s]).long(), slots,
                                         torch.from_numpy(pos[:, s]).long(), cache=cache)
                                   for s in steps], axis=1)
    prepared = zoo.native_interface(impl).decoding(model, n, length + 2)
    apply = jax.jit(prepared.apply)
    slots = np.zeros((n, length + 2), np.int32)
    slots[:, :length] = mask
    cache, out = prepared.cache, []
    for s in steps:
        logits, cache = apply(prepared.weights, cache, ids[:, s], slots, pos[:, s])
        out.append(np.asarray(logits))
    return np.concatenate(out, axis=1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", [QUICK, *(pytest.param(n, marks=pytest.mark.full_only) for n in (
    "mistral-window", "gemma2-softcap-window", "gemma3-qk-norm-local-rope",
    "phi3-gqa-window"))])
def test_cached_logits_equal_full_forward(name: str, impl: str) -> None:
    """Every library's cache, for one window (Mistral) and for sliding and full layers with
    their own rotary frequencies and soft-capping (Gemma 2 and 3)."""
    ids, mask, pos = padded_batch(dataclasses.replace(CONFIGS[name], seq_len=8))
    with torch.no_grad():
        want = _reference(name)(input_ids=torch.from_numpy(ids).long(),
                                attention_mask=torch.from_numpy(mask).long(),
                                position_ids=torch.from_numpy(pos).long()).logits.numpy()
    got = _cached_logits(name, impl, ids, mask)
    valid = mask.astype(bool)  # padding's logits are nobody's
    assert relative(got[valid], want[valid]) < 1e-5


def test_decode_step_compiles_once_and_styles_agree() -> None:
    ids, mask = _prompts(QUICK)
    model = _model(QUICK, "nnx")
    settings = Settings.of(max_new_tokens=12)
    prepared = zoo.interface("nnx").decoding(model, 3, PROMPT + 12)
    gen = Generator(prepared, settings)
    runs = {style: np.asarray(gen(ids, mask, style)) for style in ("python", "flat")}
    runs["python-again"] = np.asarray(gen(ids[::-1], mask[::-1], "python"))[::-1]
    runs["compiled"] = np.asarray(gen(ids, mask))
    runs["compiled-again"] = np.asarray(gen(ids[::-1], mask[::-1]))[::-1]
    for fn in (gen.prefill, gen.step, gen.flat_step, gen.compiled):
        assert fn._cache_size() == 1  # 11 steps, two prompts: one program each
    for style, tokens in runs.items():
        np.testing.assert_array_equal(tokens, runs["compiled"], err_msg=style)


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_input_gets_one_line(impl: str) -> None:
    model = _model("gpt2", impl)
    ids = np.zeros((2, 5), np.int32)
    cases = [
        (dict(max_new_tokens=3, max_length=4), "input_ids: the prompt's 5 tokens"),
        (dict(max_new_tokens=-1), "max_new_tokens must be an integer >= 0"),
        (dict(max_new_tokens=3, attention_mask=np.ones((2, 4))), "attention_mask of shape"),
        (dict(max_new_tokens=60), "max_new_tokens 60: the 65 tokens .* 64 positions"),
        (dict(max_new_tokens=3, top_p=0.0), "top_p must be in"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as raised:
            zoo.generate(model, impl, ids, **kwargs)
        assert "\n" not in str(raised.value)
    vision = zoo.create(zoo.tiny_config("mlp"), impl)  # not an AttributeError from inside
    with pytest.raises(ValueError, match=r"a mlp model does not generate text \(not one of"):
        zoo.generate(vision, impl, ids)


def _backend_compiles(fn) -> int:
    """How many programs XLA compiles, or takes from a persistent compilation cache (the
    suite's, conftest), while `fn()` runs: either is a program jit did not keep."""
    events = []

    def compiled(event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    def fetched(event: str, **kwargs) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(compiled)
    jax.monitoring.register_event_listener(fetched)
    try:
        fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(compiled)
        jax.monitoring.unregister_event_listener(fetched)
    return len(events)


@pytest.mark.parametrize("impl", ("eqx", *(pytest.param(i, marks=pytest.mark.full_only)
                                          for i in ("linen", "nnx"))))
def test_generate_compiles_once_across_prompts(impl: str) -> None:
    """After a first call, prompts of other lengths in its bucket (8), other contents and
    another sampling seed compile nothing; the greedy tokens stay `transformers`'."""
    ids, mask = _prompts(QUICK)
    model = _model(QUICK, impl)
    got = np.asarray(zoo.generate(model, impl, ids, mask, max_new_tokens=NEW))
    np.testing.assert_array_equal(got, _hf_generate(QUICK, ids, mask))
    other = np.random.default_rng(5).integers(0, CONFIGS[QUICK].vocab_size, (3, 8), np.int32)
    prompts = [(ids[:, -4:], mask[:, -4:]), (ids[:, 1:], mask[:, 1:]),
               (other, np.ones_like(other))]
    assert {bucket(p.shape[1]) for p, _ in prompts} == {bucket(PROMPT)}
    outputs = []
    calls = lambda: outputs.extend(np.asarray(zoo.generate(model, impl, p, m, max_new_tokens=NEW))
                                   for p, m in prompts)
    assert _backend_compiles(calls) == 0
    for (p, m), got in zip(prompts, outputs, strict=True):
        np.testing.assert_array_equal(got, _hf_generate(QUICK, p, m))
    kw = {"max_new_tokens": 8, "temperature": 0.7, "top_k": 20}
    first = np.asarray(zoo.generate(model, impl, ids, mask, seed=1, **kw))
    assert _backend_compiles(lambda: zoo.generate(model, impl, ids[:, 1:], mask[:, 1:], seed=2,
                                                  **kw)) == 0
    again = np.asarray(zoo.generate(model, impl, ids, mask, seed=1, **kw))
    np.testing.assert_array_equal(again, first)  # the seed is an argument, not a constant


def _transposed_2d(hlo: str) -> set[tuple[int, int]]:
    """The result shapes of the 2-D transposes in an HLO text."""
    return {(int(a), int(b)) for a, b in
            re.findall(r"\w+\[(\d+),(\d+)\]\{[\d,]*\} transpose\(", hlo)}


def test_equinox_decode_step_copies_no_weight() -> None:
    """The compiled decode step of GPT-2 in Equinox holds no transposed Linear weight: its
    `Linear` contracts each weight where it lies (`x @ weight.T` copied every weight, per
    token). The same contraction on a tied head's embedding copies nothing either."""
    model = _model("gpt2", "eqx")
    weights = {leaf.weight.shape for leaf in jax.tree.leaves(
        model, is_leaf=lambda x: isinstance(x, zoo.layers.eqx.Linear))
        if isinstance(leaf, zoo.layers.eqx.Linear)}
    assert len(weights) >= 3
    prepared = zoo.interface("eqx").decoding(model, 2, 16)
    gen = Generator(prepared, Settings.of(max_new_tokens=4))
    ids, mask = np.zeros((2, 4), np.int32), np.ones((2, 4), np.int32)
    state = gen.run(ids, mask, "python")
    hlo = gen.step.lower(prepared.weights, state).compile().as_text()
    assert not _transposed_2d(hlo) & {(i, o) for o, i in weights}, "a weight is transposed"
    embedding = model.transformer.wte.weight
    x = np.random.default_rng(0).standard_normal((2, 3, embedding.shape[1]), np.float32)
    compiled = jax.jit(contract).lower(x, embedding).compile().as_text()
    assert " transpose(" not in compiled
    assert_close(contract(x, embedding), x @ np.asarray(embedding).T)


@pytest.mark.parametrize("impl", [  # quick: one library's bfloat16 path
    pytest.param(i, marks=() if i == "linen" else pytest.mark.full_only) for i in IMPLS])
def test_bfloat16_greedy_equals_transformers_in_bfloat16(impl: str) -> None:
    """bfloat16 weights (and so cache) in every library, a left-padded batch, 32 tokens."""
    import jax.numpy as jnp

    hf = _reference(QUICK)
    hf16 = type(hf)(hf.config).to(torch.bfloat16).eval()
    hf16.load_state_dict(hf.state_dict())
    ids, mask = _prompts(QUICK)
    with torch.no_grad():
        want = hf16.generate(torch.from_numpy(ids).long(),
                             attention_mask=torch.from_numpy(mask).long(), max_new_tokens=NEW,
                             do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
    state = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    if impl == "torch":
        model = converters.from_canonical(state, CONFIGS[QUICK], impl).to(torch.bfloat16)
    else:
        state = {k: jnp.asarray(v, jnp.bfloat16) for k, v in state.items()}
        model = converters.from_canonical(state, CONFIGS[QUICK], impl)
    got = np.asarray(zoo.generate(model, impl, ids, mask, max_new_tokens=NEW))
    first = np.argwhere(got != want)[:1].tolist()
    assert not first, f"first difference (row, position) {first}: {got[tuple(first[0])]} " \
                      f"against transformers' {want[tuple(first[0])]}"
