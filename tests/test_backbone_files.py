"""Files of a model's backbone, saved as transformers and timm save them, read as the model
without its head (`converters.checkpoints.backbone`), in hub folders and plain state_dict
files alike, from the command line and the Python API:

- transformers' base models (`GPT2Model`, `LlamaModel`, `RobertaModel`: keys without
  `transformer.` / `model.` / `roberta.`) load; a tied head is the embedding (the whole
  GPT-2), an untied one (Llama's `lm_head`) is left at its initialisation, and the output
  says which; the hidden states (`encode`) equal the base model's `last_hidden_state`
  within 1e-5 in every library (GPT-2, Llama, BERT; ViT's class token in two);
- HF's `ViTModel` as a `torch.save` file and as safetensors reads through the same declared
  layouts as its hub folder;
- a refusal names the fix in one line: a headless timm or HF ViT file ("pass --num-classes
  0"), a `BertModel` file into a masked-LM config ("head": "base"), keys that lack the
  prefix but do not fit the config under it either;
- `--add-prefix` is taken on a hub folder (its config from `config.json`).

Tiny random models (width 16, 2 layers), float32, eager attention; each file written once.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import converters
import zoo
from converters.checkpoints.io import CheckpointError
from converters.core import ConversionError
from tests import compiled
from tests.converter_cli import cli
from zoo.libraries import native_interface

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")

HIDDEN = 1e-5  # tolerance: the bound on hidden states, float32, 2 layers of width 16
IMPLS = ("eqx", "linen", "nnx", "torch")
IDS = np.array([[5, 9, 3, 17, 2, 30], [1, 4, 4, 8, 60, 11]], np.int64)
VIT = {"image_size": [16, 16], "patch_size": 8, "width": 16, "depth": 2, "num_heads": 2,
       "mlp_ratio": 2.0, "norm_eps": 1e-12}
GPT2_3 = {"n_embd": 16, "n_layer": 3, "n_head": 2, "vocab_size": 64}  # one layer too many
BERT = {"vocab_size": 96, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 24, "max_position_embeddings": 16}


def _save(model, folder):
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The transformers / timm models with random weights and their files."""
    d = tmp_path_factory.mktemp("backbones")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(
        n_embd=16, n_layer=2, n_head=2, vocab_size=64, n_positions=16, bos_token_id=None,
        eos_token_id=None, attn_implementation="eager")).eval()
    llama = transformers.LlamaModel(transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
        bos_token_id=None, eos_token_id=None, attn_implementation="eager")).eval()
    bert = transformers.BertModel(transformers.BertConfig(
        **BERT, attn_implementation="eager")).eval()
    roberta = transformers.RobertaModel(transformers.RobertaConfig(
        **{**BERT, "max_position_embeddings": 18}, pad_token_id=1,
        attn_implementation="eager")).eval()
    vit = transformers.ViTModel(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        image_size=16, patch_size=8, attn_implementation="eager")).eval()
    headless = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0,
                                 img_size=16, patch_size=8, embed_dim=16, depth=2,
                                 num_heads=2, mlp_ratio=2.0).eval()
    out = {"models": {"gpt2": gpt2, "llama": llama, "bert": bert, "roberta": roberta,
                      "vit": vit}}
    for name, model in (("gpt2", gpt2), ("llama", llama), ("roberta", roberta),
                        ("vit", vit)):
        out[f"{name}_folder"] = _save(model, d / f"{name}_folder")
    out["gpt2_file"] = out["gpt2_folder"] / "model.safetensors"
    out["vit_safetensors"] = out["vit_folder"] / "model.safetensors"
    torch.save(vit.state_dict(), d / "vit.pt")
    out["vit_pt"] = d / "vit.pt"
    safetensors_torch.save_file(bert.state_dict(), str(d / "bert.safetensors"))
    out["bert_file"] = d / "bert.safetensors"
    torch.save(headless.state_dict(), d / "timm.pt")
    out["timm_pt"] = d / "timm.pt"
    out["dir"] = d
    return out


def _notes(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("note: ")
            and "config from" not in line]


# --------------------------------------------------------------------------- command line
def test_gpt2_model_folder_is_the_whole_gpt2(files, tmp_path, capsys):
    code, out, err = cli(capsys, "convert", files["gpt2_folder"], tmp_path / "o.safetensors",
                         "--to", "canonical")
    assert (code, err) == (0, "")
    assert _notes(out) == [
        "note: the keys lack the prefix 'transformer.': a file of gpt2's backbone "
        "(transformers' base model), read under the prefix; checked: every key and shape "
        "then fits; not checked: the outputs against the source model",
        "note: head: tied to the embedding (transformer.wte.weight): the whole gpt2"]


def test_llama_model_folder_leaves_the_untied_head_at_its_init(files, tmp_path, capsys):
    code, out, err = cli(capsys, "convert", files["llama_folder"], tmp_path / "o.safetensors",
                         "--to", "canonical")
    assert (code, err) == (0, "")
    assert _notes(out)[1] == (
        "note: head: lm_head.weight not in the file: left at its initialisation (seed 0); the "
        "hidden states (encode) are the file's, the head's output is not")


def test_roberta_model_folder_loads(files, tmp_path, capsys):
    code, out, err = cli(capsys, "convert", files["roberta_folder"],
                         tmp_path / "o.safetensors", "--to", "canonical")
    assert (code, err) == (0, "")
    assert "note: the keys lack the prefix 'roberta.'" in out
    assert "note: head: none in the model" in out


def test_add_prefix_is_taken_on_a_hub_folder(files, tmp_path, capsys):
    code, out, err = cli(capsys, "convert", files["gpt2_folder"], tmp_path / "o.safetensors",
                         "--to", "canonical", "--add-prefix", "transformer.")
    assert (code, err) == (0, "")
    assert "checked: the layout (the zoo's" in out


def test_unprefixed_keys_of_another_config_name_the_prefix(files, tmp_path, capsys):
    code, _, err = cli(capsys, "convert", files["gpt2_file"], tmp_path / "o.safetensors",
                       "--to", "canonical", "--arch", "gpt2", "--config", json.dumps(GPT2_3))
    assert code == 1
    assert err.splitlines()[1] == (
        "the keys lack the prefix 'transformer.': a file of gpt2's backbone (transformers' "
        "base model); under the prefix they still do not fit the config (below): check "
        "--arch / --config")


@pytest.mark.parametrize("source", ["vit_pt", "vit_safetensors", "timm_pt"])
def test_headless_vision_files_name_num_classes_0(files, source, tmp_path, capsys):
    args = ("convert", files[source], tmp_path / "o.safetensors", "--to", "canonical",
            "--arch", "vit", "--config", json.dumps(VIT))
    code, _, err = cli(capsys, *args)
    assert code == 1
    assert err == (f"error: {files[source]}: the file has no head (head.weight, head.bias): a "
                   "file of vit's backbone (the model without its head); pass --num-classes 0 "
                   "(in Python, a config with num_classes=0) to read it as that model\n")
    code, out, err = cli(capsys, *args, "--num-classes", "0")
    assert (code, err) == (0, "")
    assert "adapted: nothing (the weights already fit)" in out


def test_bert_model_file_into_a_masked_lm_names_the_head(files, tmp_path, capsys):
    args = ("convert", files["bert_file"], tmp_path / "o.safetensors", "--to", "canonical",
            "--arch", "bert")
    code, _, err = cli(capsys, *args, "--config", json.dumps(BERT))
    assert code == 1
    assert err == (
        f"error: {files['bert_file']}: the keys lack the prefix 'bert.' and the head "
        "(cls.predictions.bias, cls.predictions.transform.dense.weight, "
        "cls.predictions.transform.dense.bias and 2 more): a file of bert's backbone (the "
        "model without its head); pass \"head\": \"base\" in --config (in Python, a config "
        "with head='base') to read it as that model\n")
    code, out, err = cli(capsys, *args, "--config", json.dumps({**BERT, "head": "base"}))
    assert (code, err) == (0, "")
    assert "note: the keys lack the prefix 'bert.'" in out


# --------------------------------------------------------------------------- Python API
def test_python_api_refuses_with_the_same_line(files):
    with pytest.raises(CheckpointError, match=r"the file has no head .*pass --num-classes 0"):
        converters.read(files["timm_pt"], arch="vit", config=VIT)
    with pytest.raises(ConversionError, match=r"the keys lack the prefix 'transformer\.'"):
        converters.read(files["gpt2_file"], arch="gpt2", config=GPT2_3)


def test_python_api_reads_base_model_folders_and_says_so(files):
    notes = {name: converters.read(files[f"{name}_folder"]).notes
             for name in ("gpt2", "llama", "roberta")}
    assert notes["gpt2"][-1] == ("head: tied to the embedding (transformer.wte.weight): the "
                                 "whole gpt2")
    assert notes["llama"][-1].startswith("head: lm_head.weight not in the file: left at its "
                                         "initialisation (seed 0)")
    assert notes["roberta"][-2].startswith("the keys lack the prefix 'roberta.'")
    config = converters.read(files["gpt2_folder"]).config
    model = zoo.create(config, "torch", weights=files["gpt2_folder"])
    with torch.no_grad():
        want = files["models"]["gpt2"](torch.as_tensor(IDS)).last_hidden_state.numpy()
    assert np.abs(_hidden(model, "torch", IDS.astype(np.int32)) - want).max() <= HIDDEN


def _ids(config, impl):
    return native_interface(impl).to_native(IDS.astype(np.int32), config)


def _hidden(model, impl, ids, **inputs):
    """`encode`'s output, one compiled call in the JAX libraries (eager: op by op, slow)."""
    return np.asarray(compiled.call(model, impl, "encode", ids, inputs=inputs or None))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoder_base_models_hidden_states_in_every_library(files, name):
    ck = converters.read(files[f"{name}_folder"])
    with torch.no_grad():
        want = files["models"][name](torch.as_tensor(IDS)).last_hidden_state.numpy()
    for impl in IMPLS:
        got = _hidden(ck.model(impl), impl, _ids(ck.config, impl))
        assert np.abs(got - want).max() <= HIDDEN, impl


def test_bert_model_file_hidden_states_in_every_library(files):
    ck = converters.read(files["bert_file"], arch="bert", config={**BERT, "head": "base"})
    mask = np.ones_like(IDS)
    mask[1, 4:] = 0
    with torch.no_grad():
        want = files["models"]["bert"](torch.as_tensor(IDS), attention_mask=torch.as_tensor(
            mask)).last_hidden_state.numpy()
    for impl in IMPLS:
        got = _hidden(ck.model(impl), impl, _ids(ck.config, impl),
                      attention_mask=mask.astype(np.int32))
        assert np.abs(got - want)[mask == 1].max() <= HIDDEN, impl


@pytest.mark.parametrize(("source", "impl"), [("vit_pt", "linen"), ("vit_folder", "eqx")])
def test_vit_model_file_and_folder_give_the_class_token(files, source, impl):
    config = {**VIT, "num_classes": 0}
    ck = (converters.read(files[source]) if source.endswith("folder")
          else converters.read(files[source], arch="vit", config=config))
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        want = files["models"]["vit"](torch.as_tensor(x)).last_hidden_state[:, 0].numpy()
    api = native_interface(impl)  # the layouts are the point: ViT's libraries agree anyway
    got = np.asarray(api.to_canonical(api.forward(ck.model(impl), api.to_native(x)),
                                      ck.config))
    assert np.abs(got - want).max() <= HIDDEN
