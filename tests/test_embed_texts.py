"""`zoo.embed` from texts, with the model's own `tokenizer.json` (`zoo.tokenizer`), compiled
once per shape bucket:

- a WordPiece tokenizer built here with `tokenizers` (never downloaded) gives the ids and
  attention masks of transformers' `AutoTokenizer` / `BertTokenizerFast` on the same files;
- the sentence embeddings of texts equal sentence-transformers' mean pooling computed on
  transformers' `BertModel` from the same folder (compiled: NNX; eager: PyTorch; every
  library pools alike, tests/test_encoders.py);
- the encode-and-pool program is compiled once per library and bucket: calls of other
  batch sizes and lengths in the bucket, and other models of the same structure, reuse it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import converters
import zoo
from zoo.embed import compilations
from zoo.tokenizer import TokenizerError, load

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

POOLED = 1e-5  # tolerance: the bound, float32 means of 2 layers of width 16
WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "runs", "fast", "slow", "red", "blue",
         "##s", "##ing", "sun", "moon", "is", "and", "play"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz.,!?",
         *WORDS]
TEXTS = ["The cat sat on the mat.", "A red dog runs fast!", "suns and moons",
         "blue zebra playing"]
BERT = {"vocab_size": len(VOCAB), "hidden_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 24, "max_position_embeddings": 16}


def write_tokenizer(folder) -> None:
    """BERT's uncased WordPiece pipeline over `VOCAB`, as `tokenizer.json` with its
    `tokenizer_config.json`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.decoder = decoders.WordPiece()
    folder.mkdir(exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "pad_token": "[PAD]",
        "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
        "mask_token": "[MASK]", "model_max_length": 12}))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny random `BertModel` saved by transformers beside its tokenizer."""
    d = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        **BERT, attn_implementation="eager")).eval()
    model.save_pretrained(d)
    write_tokenizer(d)
    return d


def test_ids_equal_transformers_tokenizers(folder):
    ours = load(folder)
    for reference in (transformers.AutoTokenizer.from_pretrained(folder),
                      transformers.BertTokenizerFast(tokenizer_file=str(
                          folder / "tokenizer.json"))):
        for limit in (None, 6):
            want = reference(TEXTS, padding=True, truncation=limit is not None,
                             max_length=limit, return_tensors="np")
            ids, mask = ours(TEXTS, max_length=limit)
            np.testing.assert_array_equal(ids, want["input_ids"])
            np.testing.assert_array_equal(mask, want["attention_mask"])
    assert ours.model_max_length == 12
    assert ours(TEXTS * 3)[0].shape[1] <= 12


@pytest.mark.parametrize("impl", ["nnx", "torch"])  # compiled and eager: embed's two paths
def test_texts_embed_as_sentence_transformers(folder, impl):
    reference = transformers.BertModel.from_pretrained(folder, attn_implementation="eager")
    batch = transformers.AutoTokenizer.from_pretrained(folder)(
        TEXTS, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        h = reference(**batch).last_hidden_state
    weights = batch["attention_mask"][..., None].float()
    want = ((h * weights).sum(1) / weights.sum(1).clamp(min=1e-9)).numpy()
    model = converters.load(folder, impl)
    got = np.asarray(zoo.embed(model, impl, TEXTS, tokenizer=folder, pooling="mean"))
    assert np.abs(got - want).max() <= POOLED
    one = np.asarray(zoo.embed(model, impl, TEXTS[0], tokenizer=load(folder), pooling="mean"))
    assert np.abs(one - want[:1]).max() <= POOLED


def test_compiled_once_per_bucket():
    # one layer: a structure no other test embeds with, whose programs this process has not
    # compiled yet whatever ran before in it
    config = zoo.tiny_config("bert", head="base", pooling="mean", num_hidden_layers=1)
    model = zoo.create(config, "nnx", seed=0)
    ids = np.random.default_rng(0).integers(5, config.vocab_size, (4, 8))
    start = compilations()
    zoo.embed(model, "nnx", ids[:3, :5])  # bucket (4, 8)
    zoo.embed(model, "nnx", ids[:4, :8])
    zoo.embed(model, "nnx", ids[:4, :6], np.ones((4, 6)))
    zoo.embed(model, "nnx", ids[:2, :7])  # (2, 8): a new bucket
    zoo.embed(zoo.create(config, "nnx", seed=1), "nnx", ids[:2, :8])  # same structure
    assert compilations() - start == 2


def test_texts_need_a_tokenizer(folder, tmp_path):
    model = zoo.create(zoo.tiny_config("bert", head="base", pooling="mean"), "nnx", seed=0)
    with pytest.raises(ValueError, match=r"^texts need the model's tokenizer: tokenizer= a "):
        zoo.embed(model, "nnx", TEXTS)
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json \(the zoo reads"):
        load(tmp_path)


def test_the_command_line_embeds_texts_and_keeps_nothing_it_should_not(folder, tmp_path,
                                                                        capsys):
    """`python -m zoo.predict --texts ...`: the model and its tokenizer from one source, the
    cosine similarities printed within 80 columns, the vectors written to a new .npy equal to
    `zoo.embed`'s; an existing --out is refused in one line and left as it was."""
    from zoo.predict import main

    out = tmp_path / "vectors.npy"
    argv = ["--texts", *TEXTS, "--model", f"local-dir:{folder}", "--impl", "nnx",
            "--pooling", "mean"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "cosine similarity:" in printed and f"[1] {TEXTS[0]}" in printed
    assert max(len(line) for line in printed.splitlines() if str(tmp_path.parent) not in line
               and str(folder) not in line) <= 80  # our own text; the paths are the user's
    want = np.asarray(zoo.embed(converters.load(folder, "nnx"), "nnx", TEXTS,
                                tokenizer=folder, pooling="mean"))
    np.testing.assert_allclose(np.load(out), want, atol=POOLED)  # tolerance: as POOLED
    sims = np.load(out) @ np.load(out).T
    assert f"{sims[0, 0] / np.linalg.norm(np.load(out)[0]) ** 2:7.3f}" in printed
    before = out.read_bytes()
    assert main([*argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"error: --out {out}: exists (not overwritten)"
    assert out.read_bytes() == before
    with pytest.raises(SystemExit):
        main(["x.jpg", "--texts", "a"])  # images and texts: one or the other
