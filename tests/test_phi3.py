"""What the Phi-3 family adds beyond the language-model tests its variants run through
(tests/lm_reference.py: logits, training step, generation, folders): each option of the
variants changes the logits at their size; its dropout fields reach the model (off in eval,
on in training); its `config.json` reader takes both of transformers' rotary spellings,
ignores what does not change the function, and refuses the 128k-context releases' "longrope"
in one line. The fixtures of those releases (Phi-3-mini-128k-instruct, Phi-3.5-mini-instruct)
are their published config.json less the two 48-number factor lists, which the refusal never
reads."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

import converters
import zoo
from converters.adapters import config_readers
from tests.lm_reference import VARIANTS, hf_config, hf_logits, hf_state, padded_batch, relative
from zoo.testing import assert_close, tolerance

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"


@pytest.mark.full_only
@pytest.mark.parametrize(("name", "change"), [
    ("phi3-gqa-window", {"sliding_window": None}),
    ("phi3-partial-rope-tied", {"partial_rotary_factor": 1.0}),
])
def test_the_phi3_variants_exercise_their_options(name, change):
    """The reference without the option (same weights) misses transformers' logits by far."""
    cfg = VARIANTS[name]
    ids = padded_batch(cfg)[0]
    model = converters.from_canonical(hf_state(name), dataclasses.replace(cfg, **change),
                                      "torch")
    with torch.no_grad():
        got = model(torch.from_numpy(ids)).numpy()
    assert relative(got, hf_logits(name, ids)) > 1e-3


@pytest.mark.full_only
@pytest.mark.parametrize("impl", zoo.JAX_IMPLS)
def test_dropout_is_off_in_eval_and_keyed_in_training(impl):
    """`resid_pdrop` and `attention_dropout` reach the body (transformers' fields, read from
    config.json); eval computes the dropout-free function."""
    cfg = zoo.tiny_config("phi3", resid_pdrop=0.1, attention_dropout=0.1)
    spec = cfg.decoder
    assert (spec.residual_dropout, spec.attention.dropout) == (0.1, 0.1)
    state = zoo.canonical_init(cfg, seed=2)
    ids = padded_batch(cfg)[0]
    with torch.no_grad():
        want = converters.from_canonical(state, zoo.tiny_config("phi3"), "torch")(
            torch.from_numpy(ids)).numpy()
    api = zoo.interface(impl)
    static, params, st = api.split(converters.from_canonical(state, cfg, impl))
    run = jax.jit(lambda k, train: api.apply(static, params, st, ids, train=train, key=k)[0],
                  static_argnums=1)
    assert_close(np.asarray(run(jax.random.key(0), False)), want)
    a, b = run(jax.random.key(0), True), run(jax.random.key(1), True)
    assert not np.allclose(a, want, **tolerance("float32"))
    assert not np.allclose(a, b, **tolerance("float32"))


def _read(raw: dict):
    return config_readers.reader_for(raw).config(raw, "config.json")


def test_the_reader_takes_both_rotary_spellings_and_ignores_inert_fields():
    cfg = dataclasses.replace(VARIANTS["phi3-partial-rope-tied"], seq_len=None)
    raw = config_readers.writer_for(cfg).hub_config(cfg)
    assert _read(raw) == cfg
    assert hf_config(cfg).rope_parameters["partial_rotary_factor"] == 0.5
    v5 = {k: v for k, v in raw.items() if k not in ("rope_theta", "partial_rotary_factor")}
    v5["rope_parameters"] = {"rope_type": "default", "rope_theta": 100.0,
                             "partial_rotary_factor": 0.5}
    assert _read(v5) == cfg  # transformers 5's spelling
    # transformers' Phi3Model has no embedding dropout; the original length matters to
    # longrope only
    assert _read({**raw, "embd_pdrop": 0.3, "original_max_position_embeddings": 64}) == cfg


@pytest.mark.parametrize(("fields", "message"), [
    ({"head_dim": 16}, r"head_dim 16 is not supported by the zoo's phi3 \(Phi3ForCausalLM\) "
                       r"\(supported: None, 8\)"),
    ({"partial_rotary_factor": 0.125}, r"phi3.partial_rotary_factor 0.125 must be in \(0, 1\] "
                                     r"and rotate an even number"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     r"rope_scaling type 'linear' is not supported by the zoo's phi3"),
    ({"attention_bias": True}, r"attention_bias True is not supported"),
])
def test_the_reader_refuses_what_the_zoo_does_not_compute_in_one_line(fields, message):
    cfg = VARIANTS["phi3-gqa-window"]
    with pytest.raises(zoo.ConfigError, match=message):
        _read({**config_readers.writer_for(cfg).hub_config(cfg), **fields})


@pytest.mark.parametrize("name", ["phi-3-mini-128k", "phi-3.5-mini"])
def test_the_longrope_releases_are_refused_naming_longrope_and_the_field(name):
    raw = json.loads((FIXTURES / f"{name}.json").read_text())
    with pytest.raises(zoo.ConfigError) as err:
        config_readers.reader_for(raw).config(raw, f"{name}.json")
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{name}.json: rope_scaling type 'longrope'")
    assert name not in zoo.list_models("phi*")
