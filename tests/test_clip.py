"""CLIP and SigLIP (the two-tower `clip` architecture) equal transformers' `CLIPModel` and
`SiglipModel` in all four libraries (tiny random configs, every array perturbed, float32,
eager attention; `FAMILIES`: CLIP pooled at its first EOS, CLIP of `eos_token_id` 2 pooled
at the highest id, SigLIP):

- a `save_pretrained` folder read into each library (`converters.load`) gives transformers'
  text features, image features and `logits_per_image` within 1e-5 of the largest (a padded
  batch of texts with their attention mask);
- the uniform call is each pair's logit; the gradients of their sum w.r.t. every parameter:
  one JAX library against the zoo's PyTorch reference (the other libraries' agreement is the
  registry-wide tests');
- zero-shot probabilities equal in the four libraries, with a tokenizer built here
  (`tokenizers`' BPE trained on a few words) whose ids equal transformers' from the same
  files;
- a folder written by each library (`--to hub`) loads strictly in transformers with equal
  logits; config.json fields the zoo does not compute are refused by name;
- the named models' config.json (tests/fixtures/hf_configs/: the published files' fields,
  written down offline) give transformers' keys, shapes and parameter count on the meta
  device.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import numpy as np
import pytest

import converters
import zoo
from tests.lm_reference import relative
from zoo.configs import ConfigError
from zoo.predict import features, image_text_logits, zero_shot
from zoo.testing import assert_close

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
RELATIVE = 1e-5  # tolerance: the language models' measure, float32 through two towers
EOS = 3  # the tiny tokenizer's "</s>"
_SIGLIP = zoo.architecture("clip").config.VARIANTS["siglip"]
FAMILIES = {"clip": zoo.tiny_config("clip", eos_token_id=EOS),
            "clip-eos2": zoo.tiny_config("clip", eos_token_id=2),
            "siglip": zoo.tiny_config("clip", eos_token_id=EOS, **_SIGLIP)}
FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
NAMED = ("clip-vit-base-patch16", "siglip-base-patch16-224")
LABELS = ("cat", "dog", "bird")


def hf_config(config: zoo.Config):
    from converters.adapters import config_readers

    return transformers.AutoConfig.for_model(**config_readers.writer_for(config).hub_config(config))


@functools.cache
def hf_model(family: str):
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(hf_config(FAMILIES[family]),
                                               attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@functools.cache
def folder(family: str, root: Path) -> Path:
    path = root / family
    hf_model(family).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("clip")


def batch(config: zoo.Config) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images `(2, C, H, W)`, and three right-padded texts (ids, mask) with their EOS."""
    rng = np.random.default_rng(0)
    images = rng.standard_normal((2, *config.input_shape)).astype(np.float32)
    ids = rng.integers(EOS + 1, config.vocab_size, (3, config.max_position_embeddings)
                       ).astype(np.int32)
    mask = np.ones_like(ids)
    for row, end in enumerate((5, 7, 3)):
        ids[row, end] = EOS
        ids[row, end + 1:], mask[row, end + 1:] = EOS, 0  # padded with the EOS, as CLIP's
    return images, ids, mask


def hf_outputs(family: str, images, ids, mask) -> dict[str, np.ndarray]:
    t = lambda a: torch.from_numpy(a).long()
    with torch.no_grad():
        out = hf_model(family)(pixel_values=torch.from_numpy(images), input_ids=t(ids),
                               attention_mask=t(mask))
    return {"image": out.image_embeds.numpy(), "text": out.text_embeds.numpy(),
            "logits": out.logits_per_image.numpy()}


def zoo_outputs(model, impl: str, images, ids, mask) -> dict[str, np.ndarray]:
    from zoo.libraries import native_interface

    image, text = features(model, impl, images, ids, mask)
    logits = native_interface(impl).call(model, "scale_logits", image @ text.T)
    return {"image": image, "text": text, "logits": np.asarray(logits)}


@pytest.mark.parametrize(("family", "impls"), [  # quick: CLIP's arithmetic; SigLIP's is full
    ("clip", zoo.IMPLS), pytest.param("siglip", zoo.IMPLS, marks=pytest.mark.full_only),
    ("clip-eos2", ("eqx", "torch"))])
def test_a_folder_in_every_library_equals_transformers(family, impls, root):
    """Every library for CLIP and SigLIP; the legacy pooling rule in two (the time budget)."""
    images, ids, mask = batch(FAMILIES[family])
    want = hf_outputs(family, images, ids, mask)
    for impl in impls:
        model = converters.load(folder(family, root), impl)
        assert model_config(model) == FAMILIES[family]
        got = zoo_outputs(model, impl, images, ids, mask)
        for what in want:
            assert relative(got[what], want[what]) <= RELATIVE, (family, impl, what)


def model_config(model):
    return model[0].config if isinstance(model, tuple) else model.config


@pytest.mark.full_only  # the quick subset checks attention's gradients per layer kind
def test_gradients_of_the_logits_equal_the_pytorch_reference(root):
    """The uniform call is the pairs' logits (the diagonal of `logits_per_image`); d(their
    sum)/d(every parameter) in one JAX library (NNX) equals the PyTorch reference's."""
    family, impl = "clip", "nnx"
    config = FAMILIES[family]
    images, ids, mask = batch(config)
    images = np.concatenate([images, images[:1]])  # three pairs
    state = converters.to_canonical(converters.load(folder(family, root), "torch"), "torch")
    reference = converters.from_canonical(state, config, "torch")
    reference.zero_grad()
    pairs = reference(torch.from_numpy(images), torch.from_numpy(ids).long(),
                      torch.from_numpy(mask).long())
    assert pairs.shape == (3, 1)
    assert_close(pairs.detach().numpy()[:, 0],
                 np.diag(image_text_logits(reference, "torch", images, ids, mask)))
    pairs.sum().backward()
    want = {k: p.grad.numpy() for k, p in reference.named_parameters()}
    model = converters.from_canonical(state, config, impl)
    api = zoo.interface(impl)
    static, params, buffers = api.split(model)

    def loss(p):
        y, _ = api.apply(static, p, buffers, api.to_native(images, config), input_ids=ids,
                         attention_mask=mask)
        return y.sum()

    grads = converters.to_canonical(api.merge(static, jax.jit(jax.grad(loss))(params), buffers),
                                    impl)
    assert grads.keys() == want.keys()
    dead = [k for k, g in want.items() if not np.abs(g).max()]
    assert not dead, f"parameters without a gradient prove nothing: {dead}"
    assert_close({k: np.asarray(v) for k, v in grads.items()}, want)


def tiny_tokenizer(path: Path, max_length: int) -> Path:
    """A BPE trained here on a few words (lowercased, `<s> $A </s>`), saved as a model's
    tokenizer files are: tokenizer.json and tokenizer_config.json."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    words = [f"a photo of a {label}." for label in LABELS] * 5
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(words, trainers.BpeTrainer(
        vocab_size=48, special_tokens=["<unk>", "<pad>", "<s>", "</s>"]))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 3)])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>",
         "model_max_length": max_length}))
    return path


@pytest.mark.parametrize("padding", ["longest", "max_length"])
def test_the_tokenizer_gives_transformers_ids(padding, tmp_path):
    from zoo.tokenizer import load

    path = tiny_tokenizer(tmp_path, 8)
    texts = ["a photo of a cat.", "A DOG", "a photo of a bird bird bird bird."]
    ids, mask = load(path)(texts, padding=padding, max_length=8)
    want = transformers.AutoTokenizer.from_pretrained(path)(
        texts, padding=padding, truncation=True, max_length=8, return_tensors="np")
    assert (ids == want["input_ids"]).all() and (mask == want["attention_mask"]).all()
    assert ids.dtype == mask.dtype == np.int32 and ids[2, -1] == 3  # truncated, EOS kept


@pytest.mark.parametrize("family", [  # full only, as the clip architecture ("siglip" names none)
    "clip", pytest.param("siglip", marks=pytest.mark.full_only)])
def test_zero_shot_probabilities_are_equal_in_every_library(family, root, tmp_path):
    from zoo.tokenizer import load

    config = FAMILIES[family]
    tokenizer = load(tiny_tokenizer(tmp_path, config.max_position_embeddings))
    images = batch(config)[0]
    probs = {impl: zero_shot(converters.load(folder(family, root), impl), impl, images,
                             LABELS, tokenizer) for impl in zoo.IMPLS}
    for impl, p in probs.items():
        assert p.shape == (2, len(LABELS)), impl
        assert_close(p, probs["torch"], err_msg=impl)
    if config.family.probabilities == "softmax":
        assert_close(probs["torch"].sum(-1), np.ones(2))
    texts = [f"a photo of a {label}." for label in LABELS]  # transformers', from the ids
    ids, mask = tokenizer(texts, padding=config.family.text_padding,
                          max_length=config.max_position_embeddings)
    t = lambda a: torch.from_numpy(a).long()
    with torch.no_grad():
        logits = hf_model(family)(
            pixel_values=torch.from_numpy(images), input_ids=t(ids),
            attention_mask=t(mask) if config.family.text_mask else None).logits_per_image
    want = (logits.softmax(-1) if family == "clip" else logits.sigmoid()).double().numpy()
    assert_close(probs["torch"], want)


@pytest.mark.parametrize(("family", "impl"), [("clip", "linen"), ("siglip", "nnx"),
                                              ("clip-eos2", "eqx")])
def test_a_folder_written_loads_strictly_in_transformers(family, impl, root, tmp_path):
    model = converters.load(folder(family, root), impl)
    converters.save(model, tmp_path / "back", "hub")
    back, info = transformers.AutoModel.from_pretrained(
        tmp_path / "back", output_loading_info=True, attn_implementation="eager")
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    images, ids, mask = batch(FAMILIES[family])
    t = lambda a: torch.from_numpy(a).long()
    with torch.no_grad():
        got = back.eval()(pixel_values=torch.from_numpy(images), input_ids=t(ids),
                          attention_mask=t(mask)).logits_per_image.numpy()
    assert relative(got, hf_outputs(family, images, ids, mask)["logits"]) <= RELATIVE


@pytest.mark.parametrize(("where", "field", "value", "named"), [
    ("text_config", "hidden_act", "relu", "hidden_act"),
    ("text_config", "add_cross_attention", True, "add_cross_attention"),
    ("vision_config", "vision_use_head", False, "vision_use_head"),
    ("vision_config", "a_new_option", 1, "a_new_option"),
    (None, "a_new_option", 1, "a_new_option")])
def test_config_json_fields_the_zoo_does_not_compute_are_refused_by_name(where, field, value,
                                                                         named):
    from converters.adapters import config_readers

    raw = config_readers.writer_for(FAMILIES["siglip"]).hub_config(FAMILIES["siglip"])
    if where is None:
        raw[field] = value
    else:
        raw[where] = {**raw[where], field: value}
    with pytest.raises(ConfigError, match=named):
        config_readers.reader_for(raw).config(raw, "config.json")


@pytest.mark.parametrize("name", NAMED)
def test_named_models_match_their_published_config_and_transformers(name):
    from converters.adapters import config_readers

    raw = json.loads((FIXTURES / f"{name}.json").read_text())
    assert config_readers.reader_for(raw).config(raw, name) == zoo.make_config(name)
    with torch.device("meta"):
        reference = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(**raw))
    spec = converters.canonical_spec(zoo.make_config(name))
    shapes = {k: np.broadcast_to(np.float32(0), v.shape) for k, v in spec.items()}  # no data
    written = config_readers.reader_for(raw).adapter.from_zoo(shapes)
    assert {k: v.shape for k, v in written.items()} == {
        k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert sum(int(np.prod(v.shape)) for v in spec.values()) == sum(
        p.numel() for p in reference.parameters())


def test_the_tokenizer_is_read_from_a_folder_or_the_hub_cache(tmp_path, monkeypatch):
    """`zoo.tokenizer.load`: a folder, ``local-dir:``, or a Hub repository's cached files
    (offline); a folder without tokenizer.json is refused in one line naming it."""
    from tests.hub_cache import add_folder, offline_hub
    from zoo.tokenizer import load
    from zoo.weights.sources import SourceError

    path = tiny_tokenizer(tmp_path / "tok", 8)
    add_folder(tmp_path / "cache", "org/tiny-clip", path)
    offline_hub(monkeypatch, tmp_path / "cache")
    texts = ["a photo of a dog.", "cat"]
    want = load(path)(texts)
    for source in (f"local-dir:{path}", "hf-hub:org/tiny-clip"):
        got = load(source)(texts)
        assert all((g == w).all() for g, w in zip(got, want, strict=True)), source
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"no tokenizer\.json"):
        load(tmp_path / "empty")


def test_zero_shot_refuses_what_it_cannot_read(root):
    model = converters.load(folder("clip", root), "torch")
    images = batch(FAMILIES["clip"])[0]
    with pytest.raises(ConfigError, match="pass tokenizer="):
        zero_shot(model, "torch", images, LABELS)
    with pytest.raises(ConfigError, match="has no text tower"):
        zero_shot(zoo.create(zoo.tiny_config("mlp"), "torch"), "torch", images, LABELS)


def test_the_command_line_converts_a_folder_and_writes_one_back(root, tmp_path, capsys):
    """`python -m converters convert FOLDER DST` (the config from config.json, the layout
    named) and back `--to hub`, which transformers loads strictly."""
    from tests.converter_cli import cli

    capsys.readouterr()
    code, out, err = cli(capsys, "convert", folder("siglip", root), tmp_path / "z.safetensors",
                         "--to", "canonical")
    assert code == 0, err
    assert "(hf-siglip), keys renamed" in out
    assert converters.load(tmp_path / "z.safetensors").config == FAMILIES["siglip"]
    code, out, err = cli(capsys, "convert", tmp_path / "z.safetensors", tmp_path / "hf",
                         "--to", "hub")
    assert code == 0, err
    _, info = transformers.SiglipModel.from_pretrained(tmp_path / "hf",
                                                       output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
