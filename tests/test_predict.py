"""The first command a user runs, as the README prints it:
``python -m zoo.predict IMAGE --model vit_small_patch16_224 --impl nnx``, in a fresh process
whose environment names the Hugging Face cache and sets ``HF_HUB_OFFLINE=1`` before anything
imports ``huggingface_hub`` (the way a user sets them).

The full-size check (ViT-S/16's 22M random weights in the default tag's repository, laid out
by the test; the suite's one full-size load) prints the same top-5 names and probabilities as
timm's model on the same cache, preprocessed by timm's transform. The offline message is
checked with an empty cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.hub_cache import add_folder, offline_hub

ROOT = Path(__file__).resolve().parents[1]
TAG = "vit_small_patch16_224.augreg_in21k_ft_in1k"


def predict(cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "zoo.predict", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    from PIL import Image

    folder = tmp_path_factory.mktemp("photos")
    paths = []
    for name, array in zip(("china.jpg", "flower.jpg"), sklearn_datasets.load_sample_images()
                           .images, strict=True):
        Image.fromarray(array).save(folder / name, quality=95)
        paths.append(folder / name)
    return paths


def test_offline_without_the_weights_is_one_line(tmp_path, photos):
    done = predict(tmp_path / "empty-cache", str(photos[0]), "--model", "resnet50.tv_in1k")
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: hf-hub:timm/resnet50.tv_in1k is not in the Hugging "
                               "Face cache") and "HF_HUB_OFFLINE is set" in lines[0]


def test_bad_arguments_are_one_line(photos, capsys):
    from zoo.predict import main

    assert main([str(photos[0]), "--model", "resnet50.tv_in2k"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'resnet50.tv_in1k'" in err
    assert main([str(photos[0]), "--model", "resnet20-cifar"]) == 1
    assert "has no pretrained weights" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([str(photos[0]), "--impl", "jax"])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: argument --impl")


@pytest.mark.full_only
def test_first_command_prints_timms_top5(tmp_path, photos, monkeypatch):
    torch = pytest.importorskip("torch")
    timm = pytest.importorskip("timm")
    from PIL import Image
    from timm.models import save_for_hf

    cache = tmp_path / "hf-cache"
    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False).eval()
    with torch.no_grad():  # logits far apart, so that the top 5 is no tie
        model.head.weight.mul_(40)
    folder = tmp_path / "folder"
    folder.mkdir()
    save_for_hf(model, str(folder), safe_serialization=True)
    add_folder(cache, f"timm/{TAG}", folder)

    done = predict(cache, *map(str, photos), "--model", "vit_small_patch16_224",
                   "--impl", "nnx")
    assert done.returncode == 0, done.stderr
    blocks = done.stdout.strip().split("\n" + str(photos[1]))
    assert blocks[0].startswith(f"{photos[0]}: {TAG} (nnx; 224x224, bicubic, crop_pct 0.9)")

    offline_hub(monkeypatch, cache)
    ref = timm.create_model("vit_small_patch16_224", pretrained=True).eval()
    transform = timm.data.create_transform(**timm.data.resolve_model_data_config(ref))
    import zoo

    names = zoo.labels("imagenet-1k")
    for photo, block in zip(photos, blocks, strict=True):
        printed = re.findall(r"^\s+([\d.]+)%  (.+)$", block, re.M)
        assert len(printed) == 5, block
        with torch.no_grad():
            probs = torch.softmax(ref(transform(Image.open(photo).convert("RGB"))[None])
                                  .double(), -1)[0].numpy()
        best = np.argsort(-probs)[:5]
        assert [n for _, n in printed] == [names[i] for i in best]
        np.testing.assert_allclose([float(p) for p, _ in printed], 100 * probs[best],
                                   atol=0.006)  # tolerance: printed to 2 decimals
