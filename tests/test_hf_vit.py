"""HF transformers ViT as its users have it: a `save_pretrained` hub folder, a bare state dict
in the files' layout and in transformers 5's module names, both directions, each compared with the
`transformers` model itself; the refusals name q/k/v and the embeddings (a ViTModel without a
classifier converts to the zoo's ViT without a head: tests/test_hf_towers.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import chex  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import converters  # noqa: E402
from converters import adapters  # noqa: E402
from converters.matching.verify import forward, max_difference, random_input, tolerance  # noqa: E402
from tests.converter_cli import cli  # noqa: E402

SIZES = {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 16, "image_size": 8, "patch_size": 4, "num_labels": 5}
# the files' names of the blocks' layers (`save_pretrained` writes them; an independent
# statement of that layout against transformers 5's module names)
FILE_NAMES = (("vit.layers.", "vit.encoder.layer."),
              ("attention.q_proj", "attention.attention.query"),
              ("attention.k_proj", "attention.attention.key"),
              ("attention.v_proj", "attention.attention.value"),
              ("attention.o_proj", "attention.output.dense"), ("mlp.fc1", "intermediate.dense"),
              ("mlp.fc2", "output.dense"))


def hf_model(cls=None, **overrides):
    """A random HF ViT, every parameter perturbed (HF starts LayerNorms and biases at
    constants), in eval mode."""
    cls = cls or transformers.ViTForImageClassification
    torch.manual_seed(0)
    model = cls(transformers.ViTConfig(**{**SIZES, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def hf_forward(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(pixel_values=torch.from_numpy(x)).logits.double().numpy()



def test_hub_folder_converts_without_arch_and_reproduces_transformers(tmp_path, capsys):
    model = hf_model(layer_norm_eps=1e-5)
    model.save_pretrained(tmp_path / "hf")
    dst = tmp_path / "vit.safetensors"
    code, out, err = cli(capsys, "convert", tmp_path / "hf", dst, "--to", "canonical")
    assert code == 0, err
    assert "detected format: hub (config.json of the hf-vit family" in out
    assert "layout: HF transformers ViT (hf-vit), keys renamed and fused" in out
    assert ("checked: the layout (every key and shape fits vit; evidence: name, shape); not "
            "checked: the outputs against the source model (only a file was given)") in out
    assert "verified" not in out
    ck = converters.load(dst)
    assert ck.config.norm_eps == 1e-5 and ck.config.mlp_ratio == 2.0
    x = random_input(ck.config.input_shape)
    reference = hf_forward(model, x)
    for impl in ("torch", "linen", "eqx", "nnx"):
        out = forward(converters.load(dst, impl), impl, x)
        assert max_difference(reference, out) <= tolerance(), impl


def test_default_epsilon_is_transformers_1e_12_and_inspect_reads_the_folder(tmp_path, capsys):
    hf_model().save_pretrained(tmp_path / "hf")
    assert converters.load(tmp_path / "hf").config.norm_eps == 1e-12
    capsys.readouterr()
    code, out, err = cli(capsys, "inspect", tmp_path / "hf")
    assert code == 0, err
    assert "architecture: vit" in out and '"norm_eps": 1e-12' in out
    assert "loads into the zoo: yes" in out


@pytest.mark.parametrize("file_names", [False, True], ids=["modules", "file_names"])
def test_bare_state_dict_in_either_layout(tmp_path, capsys, file_names):
    model = hf_model()
    sd = model.state_dict()
    for old, new in FILE_NAMES if file_names else ():
        sd = {k.replace(old, new): v for k, v in sd.items()}
    torch.save(sd, tmp_path / "pytorch_model.bin")
    config = {"width": 8, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0, "image_size": [8, 8],
              "patch_size": 4, "num_classes": 5, "norm_eps": 1e-12}
    dst = tmp_path / "vit.pt"
    code, out, err = cli(capsys, "convert", tmp_path / "pytorch_model.bin", dst, "--to", "torch",
                         "--arch", "vit", "--config", json.dumps(config))
    assert code == 0, err
    assert f"({'hf-vit' if file_names else 'hf-vit-modules'})" in out
    x = random_input((3, 8, 8))
    out = forward(converters.load(dst, "torch"), "torch", x)
    assert max_difference(hf_forward(model, x), out) <= tolerance()


def test_zoo_vit_written_as_a_hub_folder_loads_strictly_into_transformers(tmp_path, capsys):
    import zoo

    config = zoo.make_config("vit", **{**zoo.make_config("vit").TINY, "norm_eps": 1e-12})
    native = zoo.create(config, "torch", seed=3)
    converters.save(native, tmp_path / "zoo.safetensors", "canonical")
    code, _, err = cli(capsys, "convert", tmp_path / "zoo.safetensors", tmp_path / "hf",
                       "--to", "hub")
    assert code == 0, err
    model, info = transformers.ViTForImageClassification.from_pretrained(
        tmp_path / "hf", output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or misshaped key
    x = random_input(config.input_shape)
    reference = forward(native, "torch", x)
    assert max_difference(reference, hf_forward(model.eval(), x)) <= tolerance()
    state = converters.load(tmp_path / "zoo.safetensors").state
    modules = adapters.get("hf-vit-modules").from_zoo(state)
    model = transformers.ViTForImageClassification(model.config).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in modules.items()}, strict=True)
    assert max_difference(reference, hf_forward(model, x)) <= tolerance()
    back = converters.load(tmp_path / "hf")  # and the folder reads back as the same state
    chex.assert_trees_all_equal(back.state, converters.load(tmp_path / "zoo.safetensors").state)


def test_a_training_checkpoint_is_refused_as_a_hub_folder(tmp_path, capsys):
    import optax

    import zoo

    native = zoo.create("vit", "linen", seed=0, **zoo.make_config("vit").TINY)
    opt = optax.sgd(0.1).init(zoo.interface("linen").split(native)[1])
    converters.save(native, tmp_path / "t.safetensors", "canonical", opt_state=opt, step=3)
    code, _, err = cli(capsys, "convert", tmp_path / "t.safetensors", tmp_path / "hf", "--to",
                       "hub")
    assert code == 1
    assert err.strip() == "error: a hub folder holds model weights only: pass --model-only"


def _hub_folder_with(tmp_path, drop: str = "", cls=None, **config_json) -> str:
    model = hf_model(cls)
    model.save_pretrained(tmp_path / "hf")
    sd = load_file(tmp_path / "hf" / "model.safetensors")
    save_file({k: v for k, v in sd.items() if not (drop and drop in k)},
              tmp_path / "hf" / "model.safetensors")
    if config_json:
        path = tmp_path / "hf" / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config_json}))
    return str(tmp_path / "hf")


@pytest.mark.parametrize(("drop", "named"), [
    ("layer.1.attention.attention.value.weight",
     "query, key and value are stored apart and "
     "'vit.encoder.layer.1.attention.attention.value.weight' is missing"),
    ("embeddings.position_embeddings",
     "no position embeddings (vit.embeddings.position_embeddings) in the checkpoint"),
    ("embeddings.cls_token", "no class token (vit.embeddings.cls_token) in the checkpoint"),
])
def test_refusals_name_qkv_and_embeddings(tmp_path, capsys, drop, named):
    src = _hub_folder_with(tmp_path, drop)
    capsys.readouterr()  # save_pretrained's progress bar
    code, _, err = cli(capsys, "convert", src, tmp_path / "out.safetensors", "--to", "canonical")
    assert code == 1
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert f"HF transformers ViT: {named}" in err


@pytest.mark.parametrize(("field", "value", "named"), [
    ("use_mask_token", True, "HF ViT config field(s) use_mask_token have no counterpart"),
    ("hidden_act", "relu", "hidden_act 'relu': the zoo's ViT uses exact GELU ('gelu') only"),
])
def test_config_json_fields_without_counterpart_are_refused_by_name(tmp_path, capsys, field,
                                                                    value, named):
    src = _hub_folder_with(tmp_path, **{field: value})
    code, _, err = cli(capsys, "convert", src, tmp_path / "out.safetensors", "--to", "canonical")
    assert code == 1
    assert named in err and "config.json" in err


def test_detection_is_by_content():
    keys = list(hf_model().state_dict())
    assert adapters.find(keys).name == "hf-vit-modules"
    assert adapters.find(keys, arch="resnet") is None
    zoo_keys = adapters.get("hf-vit-modules").to_zoo(dict.fromkeys(keys, np.zeros(3)))
    assert adapters.find(zoo_keys) is None  # the zoo's own names need no adapter


def test_zoo_vit_written_in_a_foreign_layout_by_one_command(tmp_path, capsys):
    """`--to torch --layout hf-vit-modules`: a state_dict in transformers' module names (q, k,
    v split back) that transformers loads strictly, with the zoo model's outputs; read back,
    the layout is recognised and the state is the zoo's again. A format that stores the zoo's
    own names, an unknown layout and another architecture's are refused in one line."""
    import zoo

    config = zoo.make_config("vit", **{**zoo.make_config("vit").TINY, "norm_eps": 1e-12})
    native = zoo.create(config, "torch", seed=4)
    src = tmp_path / "zoo.safetensors"
    converters.save(native, src, "canonical")
    code, out, err = cli(capsys, "convert", src, tmp_path / "hf.pt", "--to", "torch",
                         "--layout", "hf-vit-modules")
    assert code == 0, err
    assert "in the layout hf-vit-modules (HF transformers ViT (transformers 5 module" in out
    hf_config = transformers.ViTConfig(
        hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
        image_size=8, patch_size=4, num_labels=5, layer_norm_eps=1e-12)
    model = transformers.ViTForImageClassification(hf_config).eval()
    model.load_state_dict(torch.load(tmp_path / "hf.pt", weights_only=True), strict=True)
    x = random_input(config.input_shape)
    assert max_difference(forward(native, "torch", x), hf_forward(model, x)) <= tolerance()
    back = converters.load(tmp_path / "hf.pt")
    assert back.layout == "hf-vit-modules"
    chex.assert_trees_all_equal(back.state, converters.load(src).state)
    for flags, message in (
            (["--to", "nnx", "--layout", "hf-vit"], "--layout hf-vit: the nnx format stores "
                                                    "the zoo's own names"),
            (["--to", "torch", "--layout", "nope"], "unknown layout 'nope'; layouts: [")):
        code, _, err = cli(capsys, "convert", src, tmp_path / "x", *flags)
        assert code in (1, 2) and len(err.strip().splitlines()) == 1, err
        assert message in err, err
    resnet = tmp_path / "resnet.safetensors"
    converters.save(zoo.create(zoo.tiny_config("resnet"), "torch"), resnet, "canonical")
    code, _, err = cli(capsys, "convert", resnet, tmp_path / "r.pt", "--to", "torch",
                       "--layout", "hf-vit")
    assert code == 2 and "--layout hf-vit holds a vit (HF transformers ViT), not a resnet" in err


def test_reshape_is_exact_both_ways():
    rule = adapters.adapter.reshape((-1,), (-1, 1, 1))
    a = np.arange(6, dtype=np.float32).reshape(6, 1, 1) / 7
    assert rule.to_zoo(a).shape == (6,)
    assert rule.to_foreign(rule.to_zoo(a)).tobytes() == a.tobytes()
    assert rule.name == "reshape (-1, 1, 1) -> (-1,)"


def test_import_state_and_load_apply_the_layout_adapters_as_the_command_line(tmp_path):
    """The Python API takes the HF layout as the CLI does (one renaming step): a
    ViTForImageClassification state dict through `converters.import_state` and
    `converters.load`, each equal to transformers' logits."""
    model = hf_model()
    import zoo

    config = zoo.make_config(
        "vit", width=8, depth=2, num_heads=2, mlp_ratio=2.0, image_size=(8, 8), patch_size=4,
        num_classes=5, norm_eps=1e-12)
    x = random_input((3, 8, 8))
    want = hf_forward(model, x)
    res = converters.import_state(model.state_dict(), "torch", config, verify_with="nnx")
    assert res.notes[0].startswith("layout: HF transformers ViT (transformers 5 module names)")
    assert {r.rule for r in res.rows} == {"name"}
    assert max_difference(want, forward(converters.from_canonical(res.state, config, "eqx"),
                                        "eqx", x)) <= tolerance()
    torch.save(model.state_dict(), tmp_path / "vit.bin")
    loaded = converters.load(tmp_path / "vit.bin", "linen", config=config)
    assert max_difference(want, forward(loaded, "linen", x)) <= tolerance()
