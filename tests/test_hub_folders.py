"""Hub folders as timm writes them (``save_for_hf``: ``config.json`` + ``model.safetensors``)
convert with no --arch/--config: the config comes from config.json through `zoo.names`; an
unknown field is refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

import converters
from converters.checkpoints import detect
from converters.matching.verify import forward, max_difference, tolerance
from tests.converter_cli import cli

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")



@pytest.fixture(scope="module")
def timm_folder(tmp_path_factory):
    """timm's resnet18 (7 classes, 64x64 input, random weights, BatchNorm statistics
    perturbed) saved the way ``push_to_hf_hub`` saves it, offline."""
    from timm.models import save_for_hf

    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=7).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    folder = tmp_path_factory.mktemp("hub") / "resnet18-demo"
    folder.mkdir()
    save_for_hf(model, str(folder), safe_serialization=True,
                data_config={"input_size": (3, 64, 64)})
    return folder, model


def test_timm_folder_converts_without_arch(timm_folder, tmp_path, capsys):
    folder, model = timm_folder
    assert detect(folder).fmt == "hub"
    dst = tmp_path / "r18.safetensors"
    code, out, err = cli(capsys, "convert", folder, dst, "--to", "canonical")
    assert code == 0, err
    assert "timm hub folder" in out and "config from" in out
    ck = converters.load(dst)
    assert ck.config.num_classes == 7 and tuple(ck.config.input_size) == (64, 64)
    assert ck.config.layers == (2, 2, 2, 2)
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    got = forward(converters.load(dst, "torch"), "torch", x)  # the zoo's model, not timm's
    assert max_difference(forward(model, "torch", x), got) <= tolerance()
    back = tmp_path / "r18.pt"
    code, _, err = cli(capsys, "convert", dst, back, "--to", "torch")
    assert code == 0, err
    fresh = timm.create_model("resnet18", pretrained=False, num_classes=7).eval()
    fresh.load_state_dict(torch.load(back, weights_only=True), strict=True)


def test_unknown_config_fields_are_refused_by_name(timm_folder, tmp_path, capsys):
    folder, _ = timm_folder
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").symlink_to(folder / "model.safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_args": {
        **cfg.get("model_args", {}), "output_stride": 8}}))
    code, _, err = cli(capsys, "convert", bad, tmp_path / "o.pt", "--to", "torch")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "model_args.output_stride=8" in err and "config.json" in err
    (bad / "config.json").write_text(json.dumps({**cfg, "extra_field": 1}))
    code, _, err = cli(capsys, "convert", bad, tmp_path / "o.pt", "--to", "torch")
    assert code == 1 and "'extra_field'" in err


def test_architectures_no_family_writes_get_the_zoos_own_folder(timm_folder, tmp_path,
                                                                capsys):
    """timm's reader maps many architectures, so it writes none: --to hub for a ResNet writes
    the zoo's own folder (config.json with the zoo's marker and config, the weights in the
    canonical names), which reads back as it was and loads into timm; a newer format version
    in it is refused by name."""
    from safetensors.torch import load_file

    folder, model = timm_folder
    assert "hub" not in converters.checkpoints.FORMATS  # not a format for any checkpoint
    again = tmp_path / "again"
    code, _, err = cli(capsys, "convert", folder, again, "--to", "hub")
    assert code == 0, err
    raw = json.loads((again / "config.json").read_text())
    assert raw["zoo_checkpoint"] == 1 and raw["arch"] == "resnet"
    code, out, err = cli(capsys, "inspect", again)
    assert code == 0 and "zoo hub folder" in out, err
    back = converters.load(again)
    assert back.config == converters.load(folder).config
    fresh = timm.create_model("resnet18", pretrained=False, num_classes=7).eval()
    fresh.load_state_dict(load_file(again / "model.safetensors"), strict=True)
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    (again / "config.json").write_text(json.dumps({**raw, "zoo_checkpoint": 99}))
    code, _, err = cli(capsys, "inspect", again)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "written by a newer jax-model-zoo (format 99" in err


def test_timm_folder_with_pytorch_model_bin(timm_folder, tmp_path, capsys):
    """The weights file of a hub folder is read by its own format class: timm's
    ``pytorch_model.bin`` (a torch.save zip) gives the same checkpoint as the safetensors."""
    from timm.models import save_for_hf

    _, model = timm_folder
    folder = tmp_path / "bin-folder"
    folder.mkdir()
    save_for_hf(model, str(folder), safe_serialization=False,
                data_config={"input_size": (3, 64, 64)})
    assert (folder / "pytorch_model.bin").is_file()
    assert not (folder / "model.safetensors").exists()
    code, out, err = cli(capsys, "inspect", folder)
    assert code == 0, err
    assert "hub" in out and "pytorch_model.bin" in out and "conv1.weight" in out
    got = converters.load(folder)
    want = {k: v.numpy() for k, v in model.state_dict().items()}
    assert set(got.state) == set(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got.state[k], v, err_msg=k)
