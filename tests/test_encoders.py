"""BERT and RoBERTa equal `transformers` in all four libraries: the masked-LM, sequence
classification and base models (`VARIANTS`, small configs of the `transformers` model with
random weights, float32, eager attention):

- the canonical keys of every library are transformers' `state_dict()` keys (less the tied
  decoder's aliases);
- outputs within 1e-5 of the largest (the language models' relative measure; every library
  for the tiny BERT, two per other variant in turn) on a
  right-padded batch with token types, at the tokens (transformers computes the padding's
  rows too, from the tokens: they are not compared), and the base model's pooler;
- one `zoo.runtime.fast` training step (the head's loss, dropout off) in a JAX library (each in
  turn) equal to PyTorch's gradients, whose loss is transformers' own `labels=` loss;
- Hugging Face folders in and out (`converters.load` / `converters.save(..., "hub")`) load
  back in transformers' Auto classes with equal outputs; config.json fields the zoo does not
  compute are refused by name;
- the named models' published config.json files (tests/fixtures/hf_configs/) give
  transformers' keys, shapes and parameter count on the meta device.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import converters
import zoo
from tests.lm_reference import relative
from zoo.configs import ConfigError
from zoo.runtime import fast
from zoo.runtime.training import IGNORE, LOSSES
from zoo.testing import assert_close

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
RELATIVE = 1e-5
_ROBERTA = {"model_type": "roberta", "pad_token_id": 1, "type_vocab_size": 1,
            "max_position_embeddings": 18}
VARIANTS: dict[str, zoo.Config] = {
    "bert-mlm": zoo.tiny_config("bert"),  # tied decoder, GELU
    "bert-mlm-relu": zoo.tiny_config("bert", hidden_act="relu", layer_norm_eps=1e-5),
    "bert-classifier": zoo.tiny_config("bert", head="sequence_classification", num_labels=3),
    "bert-base": zoo.tiny_config("bert", head="base", type_vocab_size=3),
    "roberta-mlm": zoo.tiny_config("bert", **_ROBERTA),
    "roberta-classifier": zoo.tiny_config("bert", **_ROBERTA, head="sequence_classification"),
}
QUICK = "bert-mlm"
PADDING = (0, 3, 1)  # right padding of each row of the batch
AUTO = {"masked_lm": "AutoModelForMaskedLM",
        "sequence_classification": "AutoModelForSequenceClassification", "base": "AutoModel"}
FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
NAMED = {"bert-base-uncased": "bert-base-uncased.json",
         "bert-large-uncased": "bert-large-uncased.json",
         "all-minilm-l6-v2": "all-MiniLM-L6-v2.json",
         "roberta-base": "roberta-base.json",
         "roberta-large": "roberta-large.json"}


def variants() -> list:
    return [n if n == QUICK else pytest.param(n, marks=pytest.mark.full_only) for n in VARIANTS]


def rotated(libraries: tuple[str, ...], per_variant: int) -> list:
    """(variant, library) pairs: every library for `QUICK`, then `per_variant` of `libraries`
    per variant in turn (every library meets several variants; the suite's time budget)."""
    pairs = [(QUICK, impl) for impl in libraries]
    others = [n for n in VARIANTS if n != QUICK]
    for i, name in enumerate(others):
        pairs += [pytest.param(name, libraries[(i * per_variant + j) % len(libraries)],
                               marks=pytest.mark.full_only) for j in range(per_variant)]
    return pairs


def hf_config(config: zoo.Config):
    from converters.adapters import config_readers

    data = config_readers.writer_for(config).hub_config(config)
    return transformers.AutoConfig.for_model(**data)


@functools.cache
def hf_model(name: str):
    """The transformers model of variant `name`: random weights, every array perturbed,
    float32, eval mode, eager attention."""
    transformers.logging.set_verbosity_error()
    cfg = VARIANTS[name]
    torch.manual_seed(0)
    model = getattr(transformers, AUTO[cfg.head]).from_config(
        hf_config(cfg), attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def hf_state(name: str) -> dict[str, np.ndarray]:
    """The transformers model's `state_dict()` under the zoo's names: the base model's keys
    prefixed with the body's name (`bert.`), as the heads' models and the zoo have them."""
    cfg = VARIANTS[name]
    prefix = f"{cfg.family.body}." if cfg.head == "base" else ""
    return {prefix + k: v.numpy().copy() for k, v in hf_model(name).state_dict().items()}


def batch(cfg: zoo.Config, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, attention_mask, token_type_ids) of a right-padded batch (the padding
    `pad_token_id`, as a tokenizer pads)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, cfg.vocab_size, (len(PADDING), cfg.length)).astype(np.int32)
    mask = np.ones_like(ids)
    for row, pad in enumerate(PADDING):
        if pad:
            mask[row, -pad:], ids[row, -pad:] = 0, cfg.pad_token_id
    types = rng.integers(0, cfg.type_vocab_size, ids.shape).astype(np.int32)
    return ids, mask, types


def hf_outputs(name: str, ids, mask, types) -> np.ndarray:
    with torch.no_grad():
        out = hf_model(name)(**{k: torch.from_numpy(a).long() for k, a in (
            ("input_ids", ids), ("attention_mask", mask), ("token_type_ids", types))})
    return (out.last_hidden_state if VARIANTS[name].head == "base" else out.logits).numpy()


def _compared(cfg: zoo.Config, y: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The outputs transformers defines: every row's class logits, or the tokens' outputs."""
    return y if cfg.head == "sequence_classification" else y[mask.astype(bool)]


@functools.cache
def _model(name: str, impl: str):
    return converters.from_canonical(hf_state(name), VARIANTS[name], impl)


def _outputs(name: str, impl: str) -> np.ndarray:
    cfg = VARIANTS[name]
    ids, mask, types = batch(cfg)
    model = _model(name, impl)
    if impl == "torch":
        with torch.no_grad():
            return model(*(torch.from_numpy(a) for a in (ids, mask)),
                         token_type_ids=torch.from_numpy(types)).numpy()
    return np.asarray(fast.forward(model, impl)(ids, attention_mask=mask, token_type_ids=types))


@pytest.mark.parametrize("name", variants())
def test_canonical_keys_are_transformers_state_dict_keys(name):
    want = sorted(k for k in hf_state(name) if k not in {t.alias for t in VARIANTS[name].ties})
    for impl in zoo.IMPLS:
        assert sorted(converters.to_canonical(_model(name, impl), impl)) == want, impl


@pytest.mark.parametrize(("name", "impl"), rotated(zoo.IMPLS, 2))
def test_outputs_equal_transformers_on_a_padded_batch(name, impl):
    cfg = VARIANTS[name]
    ids, mask, types = batch(cfg)
    got, want = _outputs(name, impl), hf_outputs(name, ids, mask, types)
    assert got.shape == (len(PADDING), *cfg.output_shape)
    assert relative(_compared(cfg, got, mask), _compared(cfg, want, mask)) <= RELATIVE
    row = 1  # a padded row alone, unpadded: the padding changes nothing else
    alone = hf_outputs(name, *(a[row:row + 1, :cfg.length - PADDING[row]]
                               for a in (ids, mask, types)))
    got_row = got[row] if cfg.head == "sequence_classification" else got[row, :alone.shape[1]]
    assert relative(got_row, alone[0]) <= RELATIVE


@pytest.mark.full_only
@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_the_base_models_pooler_equals_transformers(impl):
    name = "bert-base"
    cfg = VARIANTS[name]
    ids, mask, types = batch(cfg)
    with torch.no_grad():
        want = hf_model(name)(input_ids=torch.from_numpy(ids).long(),
                              attention_mask=torch.from_numpy(mask).long(),
                              token_type_ids=torch.from_numpy(types).long()).pooler_output
    model, h = _model(name, impl), _outputs(name, impl)
    got = zoo.native_interface(impl).call(model, "pooled", h)
    assert relative(np.asarray(got), want.numpy()) <= RELATIVE


def _labels(cfg: zoo.Config, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The head's training targets: the tokens (padding ignored), classes, or hidden states."""
    if cfg.head == "masked_lm":
        return np.where(mask.astype(bool), ids, IGNORE).astype(np.int32)
    if cfg.head == "sequence_classification":
        return np.arange(len(ids), dtype=np.int32) % cfg.num_labels
    return np.random.default_rng(3).standard_normal((len(ids), *cfg.output_shape), np.float32)


def _torch_loss(cfg: zoo.Config, y, labels: np.ndarray):
    import torch.nn.functional as F

    target = torch.from_numpy(labels)
    if cfg.head == "masked_lm":
        return F.cross_entropy(y.flatten(0, 1), target.flatten().long(), ignore_index=IGNORE)
    if cfg.head == "sequence_classification":
        return F.cross_entropy(y, target.long())
    return F.mse_loss(y, target)


@functools.cache
def _one_step(name: str, impl: str) -> tuple[float, dict[str, np.ndarray]]:
    """The head's loss of the padded batch and the canonical parameters after one SGD step of
    learning rate 1 in training mode (`zoo.runtime.fast.train_step`; PyTorch: its autograd gradients
    subtracted)."""
    cfg = VARIANTS[name]
    ids, mask, types = batch(cfg, seed=1)
    labels = _labels(cfg, ids, mask)
    if impl == "torch":
        model = _model(name, impl).train()
        y = model(torch.from_numpy(ids), torch.from_numpy(mask),
                  token_type_ids=torch.from_numpy(types))
        loss = _torch_loss(cfg, y, labels)
        loss.backward()
        return loss.item(), {k: (p - (0 if p.grad is None else p.grad)).detach().numpy()
                             for k, p in model.named_parameters()}  # the base's pooler: none
    step = fast.train_step(_model(name, impl), impl, optax.sgd(1.0), LOSSES[cfg.LOSS])
    api = zoo.interface(impl)
    target = labels if cfg.head != "base" else api.to_native(labels, cfg)
    loss = step(api.to_native(ids, cfg), target, attention_mask=api.to_native(mask, cfg),
                token_type_ids=api.to_native(types, cfg))
    return float(loss), {k: np.asarray(v) for k, v in
                         converters.to_canonical(step.model(), impl).items()}


@pytest.mark.full_only
@pytest.mark.parametrize(("name", "impl"), rotated(zoo.JAX_IMPLS, 1)[len(zoo.JAX_IMPLS) - 1:])
def test_one_training_step_and_every_gradient_agree_with_pytorch(name, impl):
    """transformers' loss, PyTorch's gradients, and one JAX library's step (in turn)."""
    cfg = VARIANTS[name]
    ids, mask, types = batch(cfg, seed=1)
    labels = _labels(cfg, ids, mask)
    if cfg.head != "base":  # transformers' own loss for labels=
        with torch.no_grad():
            want = hf_model(name)(input_ids=torch.from_numpy(ids).long(),
                                  attention_mask=torch.from_numpy(mask).long(),
                                  token_type_ids=torch.from_numpy(types).long(),
                                  labels=torch.from_numpy(labels).long()).loss.item()
    before = {k: np.asarray(v) for k, v in converters.to_canonical(
        _model(name, "nnx"), "nnx").items()}
    loss_t, after_t = _one_step(name, "torch")
    if cfg.head != "base":
        assert_close(loss_t, want)
    dead = [k for k in before if "weight" in k and not np.abs(before[k] - after_t[k]).max()
            and "pooler" not in k]  # the base model's loss does not read its pooler
    assert not dead, f"parameters without a gradient prove nothing: {dead}"
    loss, after = _one_step(name, impl)
    assert_close(loss, loss_t, err_msg=impl)
    assert after.keys() == after_t.keys(), impl
    assert_close({k: before[k] - after[k] for k in after},
                 {k: before[k] - after_t[k] for k in after})


@pytest.mark.full_only
@pytest.mark.parametrize("impl", ["eqx", "torch"])  # Linen's and NNX's: the body's (GPT-2's)
def test_dropout_is_off_in_eval_and_on_in_training(impl):
    cfg = zoo.tiny_config("bert", hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)
    model = zoo.create(cfg, impl, seed=0)
    ids = batch(cfg)[0]
    api = zoo.interface(impl) if impl != "torch" else None
    if impl == "torch":
        with torch.no_grad():
            eval_ = model.eval()(torch.from_numpy(ids)).numpy()
            train = model.train()(torch.from_numpy(ids)).numpy()
    else:
        eval_ = np.asarray(fast.forward(model, impl)(ids))
        static, params, state = api.split(model)
        train = np.asarray(api.apply(static, params, state, api.to_native(ids, cfg), train=True,
                                     key=jax.random.key(1))[0])
    # tolerance: dropout 0.1 changes outputs by O(0.1); 1e-3 only says they differ
    assert np.isfinite(train).all() and not np.allclose(train, eval_, atol=1e-3)


def test_an_encoder_does_not_generate():
    """Encoders declare it (`GENERATES`): generation refuses them in one line, and the
    generation benchmark too."""
    from zoo.bench.generation import run_from_args

    cfg = VARIANTS[QUICK]
    assert not cfg.GENERATES and zoo.tiny_config("gpt2").GENERATES
    with pytest.raises(ValueError, match="does not generate"):
        zoo.generate(_model(QUICK, "torch"), "torch", batch(cfg)[0])
    args = type("Args", (), {"preset": None, "arch": "bert", "config": None})()
    with pytest.raises(ValueError, match="does not generate"):
        run_from_args(args)


ROUND_TRIPS = [pytest.param(*case, marks=pytest.mark.full_only) if case[0] != QUICK else case
               for case in (("bert-mlm", "eqx"), ("bert-classifier", "linen"),
                            ("bert-base", "nnx"), ("roberta-mlm", "torch"),
                            ("roberta-classifier", "eqx"), ("bert-mlm-relu", "nnx"))]


@pytest.mark.parametrize(("name", "impl"), ROUND_TRIPS)
def test_hf_folder_to_a_library_and_back_loads_in_transformers(name, impl, tmp_path):
    cfg = VARIANTS[name]
    hf_model(name).save_pretrained(tmp_path / "hf")
    model = converters.load(tmp_path / "hf", impl)
    converters.save(model, tmp_path / "back", "hub")
    auto = getattr(transformers, AUTO[cfg.head])
    back, info = auto.from_pretrained(tmp_path / "back", output_loading_info=True,
                                      attn_implementation="eager")
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids, mask, types = batch(cfg)
    with torch.no_grad():
        out = back.eval()(input_ids=torch.from_numpy(ids).long(),
                          attention_mask=torch.from_numpy(mask).long(),
                          token_type_ids=torch.from_numpy(types).long())
    got = out.last_hidden_state if cfg.head == "base" else out.logits
    want = hf_outputs(name, ids, mask, types)
    assert relative(_compared(cfg, got.numpy(), mask), _compared(cfg, want, mask)) <= RELATIVE


@pytest.mark.parametrize(("field", "value"), [
    ("position_embedding_type", "relative_key"), ("is_decoder", True),
    ("architectures", ["BertForTokenClassification"]), ("num_experts", 4),
    ("a_new_option", 1)])
def test_config_json_fields_the_zoo_does_not_compute_are_refused_by_name(field, value):
    from converters.adapters import config_readers

    raw = {**config_readers.writer_for(VARIANTS[QUICK]).hub_config(VARIANTS[QUICK]), field: value}
    with pytest.raises(ConfigError, match=field if field != "num_experts" else "experts"):
        config_readers.reader_for(raw).config(raw, "config.json")


@pytest.mark.parametrize("name", NAMED)
def test_named_models_match_their_published_config_and_transformers(name):
    """The named model's config is the published config.json's (read by the zoo's reader),
    and its canonical keys, shapes and parameter count are transformers' model's on the meta
    device (no weights)."""
    from converters.adapters import config_readers

    raw = json.loads((FIXTURES / NAMED[name]).read_text())
    read = config_readers.reader_for(raw).config(raw, NAMED[name])
    named = zoo.make_config(name)
    assert read.to_dict() == {**named.to_dict(), "pooling": None}
    with torch.device("meta"):
        reference = getattr(transformers, AUTO[named.head]).from_config(
            transformers.AutoConfig.for_model(**raw))
    prefix = f"{named.family.body}." if named.head == "base" else ""
    want = {prefix + k: tuple(v.shape) for k, v in reference.state_dict().items()}
    want = {k: v for k, v in want.items() if k not in {t.alias for t in named.ties}}
    spec = converters.canonical_spec(named)
    assert {k: tuple(v.shape) for k, v in spec.items()} == want
    assert sum(np.prod(s) for s in want.values()) == sum(
        p.numel() for p in reference.parameters())


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_embed_pools_as_sentence_transformers(impl):
    """`zoo.embed`'s mean pooling (the padding left out) and first-token pooling equal those
    of transformers' hidden states; a config without `pooling` asks for one."""
    name = "bert-base"
    cfg = VARIANTS[name]
    ids, mask, types = batch(cfg)
    h = hf_outputs(name, ids, mask, types)
    weights = mask[..., None].astype(np.float32)
    want = {"mean": (h * weights).sum(1) / weights.sum(1), "cls": h[:, 0]}
    model = _model(name, impl)
    for pooling, expected in want.items():
        got = zoo.embed(model, impl, ids, mask, token_type_ids=types, pooling=pooling)
        assert relative(np.asarray(got), expected) <= RELATIVE, pooling
    with pytest.raises(ValueError, match="pooling None"):
        zoo.embed(model, impl, ids, mask)
