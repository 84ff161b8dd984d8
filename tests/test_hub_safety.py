"""The new surface refuses hostile input in one line, reads nothing outside the cache and runs
no code from the Hub: repository ids and revisions with ``..``, absolute paths or odd
characters; a ``config.json`` that is huge, deeply nested or of the wrong type or kind; a cache
entry that links out of the cache; a file whose content or size does not match its hash or
the commit's listing; shard names that climb out of the snapshot; a pickle that would run code.

The caches are laid out by hand (`tests/hub_cache.py`) with tiny files: nothing here builds a
model bigger than the tiny ViT.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

import zoo
from converters import CheckpointError
from converters.checkpoints.io import UsageError
from tests.converter_cli import cli
from tests.hub_cache import add_repo, blob_name, offline_hub
from zoo.weights.sources import MAX_JSON_BYTES, BadSourceError, Source, SourceError, read_json

VIT = zoo.tiny_config("vit")  # 8x8 images, patch 4, width 8, 5 classes
# What a refusal raises: the zoo's source checks (zoo.weights.sources), the converters' readers, a
# config.
REFUSED = (SourceError, CheckpointError, zoo.ConfigError)


def tiny_vit_files() -> dict[str, bytes]:
    """A timm-style folder of the tiny ViT: config.json and model.safetensors."""
    from converters.core import canonical_spec

    rng = np.random.default_rng(0)
    state = {k: rng.standard_normal(s.shape).astype(np.float32)
             for k, s in canonical_spec(VIT).items()}
    config = {"architecture": "vit_tiny_patch16_224", "num_classes": 5,
              "model_args": {"depth": 2, "embed_dim": 8, "num_heads": 2, "mlp_ratio": 2.0,
                             "patch_size": 4, "img_size": [8, 8]},
              "pretrained_cfg": {"input_size": [3, 8, 8], "num_classes": 5}}
    return {"config.json": json.dumps(config).encode(), "model.safetensors": save(state)}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    return offline_hub(monkeypatch, tmp_path / "hf-cache")


def refused(excinfo, *said: str) -> str:
    text = str(excinfo.value)
    assert "\n" not in text, text
    for s in said:
        assert s in text, text
    return text


def test_the_tiny_folder_loads(cache):
    add_repo(cache, "org/tiny-vit", tiny_vit_files())
    model = zoo.create("hf-hub:org/tiny-vit", "nnx", pretrained=True)
    assert model.config == VIT


@pytest.mark.parametrize("text", [
    "hf-hub:../etc", "hf-hub:org/../x", "hf-hub:/etc/passwd", "hf-hub:org//x", "hf-hub:a/b/c",
    "hf-hub:org/x y", "hf-hub:org/x\\y", "hf-hub:orgé/x", "hf-hub:org/x\x00", "hf-hub:",
    "hf-hub:org--a/x", "hf-hub:org/.x", "hf-hub:org/x.", "hf-hub:org/x@", "hf-hub:org/x@../x",
    "hf-hub:org/x@/abs", "hf-hub:org/x@a//b", "hf-hub:org/x@a/../../b", "hf-hub:org/x@v1.lock",
    "hf-hub:org/x@v 1", "hf-hub:org/x@" + "a" * 300, "local-dir:",
])
def test_odd_repository_ids_and_revisions_are_refused(text, cache, tmp_path, capsys):
    with pytest.raises(BadSourceError) as e:
        Source.parse(text)
    refused(e)
    with pytest.raises(BadSourceError):
        zoo.create(text, "nnx", pretrained=True)
    code, _, err = cli(capsys, "convert", text, tmp_path / "out", "--to", "nnx")
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert not (tmp_path / "out").exists()
    assert not any(cache.rglob("*")) if cache.exists() else True  # nothing written


def test_plain_ids_and_revisions_pass():
    for text in ("hf-hub:timm/resnet50.a1_in1k", "hf-hub:gpt2", "hf-hub:Qwen/Qwen2.5-0.5B",
                 "hf-hub:org/x@refs/pr/1", "hf-hub:org/x@v1.0", "hf-hub:org/x@" + "a" * 40):
        assert str(Source.parse(text)) == text


def test_not_cached_offline_is_one_line(cache, capsys, tmp_path):
    with pytest.raises(SourceError) as e:
        Source.parse("hf-hub:org/absent").folder()
    refused(e, "hf-hub:org/absent is not in the Hugging Face cache", "HF_HUB_OFFLINE is set",
            "hf download org/absent")
    code, _, err = cli(capsys, "inspect", "hf-hub:org/absent@v2")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "--revision v2" in err


@pytest.mark.parametrize("content, said", [
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 32 levels"),
    (b'{"architecture": "vit", "a": ' + b"[" * 40 + b"1" + b"]" * 40 + b"}",
     "nested deeper than 32 levels"),
    (b'["architecture"]', "must be a JSON object, found list"),
    (b"\xff\xfe{}", "not a JSON file"),
    (b"{'architecture': 1}", "not a JSON file"),
    (json.dumps({"architecture": "vit_tiny_patch16_224", "pretrained_cfg": [1]}).encode(),
     "pretrained_cfg must be an object, found list"),
    (json.dumps({"architecture": "vit_tiny_patch16_224",
                 "pretrained_cfg": {"input_size": "3x8x8"}}).encode(),
     "pretrained_cfg.input_size must be a list of positive integers"),
    (json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": "5"}).encode(),
     "num_classes must be an integer, found str"),
    (json.dumps({"architecture": "vit_tiny_patch16_224", "model_args": {"depth": "2"}}).encode(),
     "ViTConfig.depth: expected an integer, found '2'"),
    (json.dumps({"model_type": "t5", "architectures": ["T5Model"]}).encode(),
     "a transformers config of model_type 't5' (T5Model), which no zoo reader reads"),
    (json.dumps({"model_type": "vit", "auto_map": {"AutoModel": "x.Y"}}).encode(),
     "auto_map"),
    (json.dumps({"architecture": 5}).encode(), "no zoo reader reads"),
    (json.dumps({"_class_name": "UNet2DModel"}).encode(), "a diffusers config"),
])
def test_hostile_config_json_is_refused_in_one_line(cache, content, said, capsys, tmp_path):
    files = {**tiny_vit_files(), "config.json": content}
    add_repo(cache, "org/bad", files)
    with pytest.raises(REFUSED) as e:
        zoo.create("hf-hub:org/bad", "nnx", pretrained=True)
    refused(e, said)
    code, _, err = cli(capsys, "convert", "hf-hub:org/bad", tmp_path / "o", "--to", "nnx")
    assert code in (1, 2) and len(err.strip().splitlines()) == 1 and said in err


def test_huge_config_json_is_refused_unread(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    with open(path, "wb") as f:
        f.truncate(MAX_JSON_BYTES + 1)  # sparse: huge, and not read
    opened = []
    real = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (opened.append(str(f)),
                                                              real(f, *a, **k))[1])
    with pytest.raises(SourceError) as e:
        read_json(path)
    refused(e, f"{MAX_JSON_BYTES + 1:,} bytes, more than a config file holds")
    assert str(path) not in opened


def test_huge_config_json_in_the_cache_is_refused_unhashed(cache, monkeypatch):
    snapshot = add_repo(cache, "org/huge", tiny_vit_files())
    blob = Path(os.path.realpath(snapshot / "config.json"))
    with open(blob, "r+b") as f:
        f.truncate(MAX_JSON_BYTES + 1)
    monkeypatch.setattr("zoo.weights.sources.git_blob_sha1", lambda path: pytest.fail("hashed"))
    with pytest.raises(REFUSED) as e:
        zoo.create("hf-hub:org/huge", "nnx", pretrained=True)
    refused(e, "config.json: 16,777,217 bytes, more than a config file holds")


def test_wrong_architecture_for_the_name_is_refused(cache):
    """The tag names a ResNet; the repository holds a ViT: refused naming both."""
    add_repo(cache, "timm/resnet18.a1_in1k", tiny_vit_files())
    with pytest.raises(REFUSED) as e:
        zoo.create("resnet18.a1_in1k", "nnx", pretrained=True)
    refused(e, "holds a vit, not a resnet")


def _repo_root(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def test_cache_entry_linking_out_of_the_cache_is_refused_unread(cache, tmp_path, monkeypatch):
    snapshot = add_repo(cache, "org/escape", tiny_vit_files())
    outside = tmp_path / "outside" / "secret.safetensors"
    outside.parent.mkdir()
    outside.write_bytes((snapshot / "model.safetensors").read_bytes())
    (snapshot / "model.safetensors").unlink()
    (snapshot / "model.safetensors").symlink_to(outside)
    opened = []
    real = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (opened.append(os.path.realpath(
        f) if isinstance(f, str | os.PathLike) else f), real(f, *a, **k))[1])
    with pytest.raises(REFUSED) as e:
        zoo.create("hf-hub:org/escape", "nnx", pretrained=True)
    refused(e, "model.safetensors: the cache entry links out of the cache", "nothing read")
    assert str(outside) not in opened


def test_repository_folder_linking_out_of_the_cache_is_refused(cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    add_repo(elsewhere, "org/moved", tiny_vit_files())
    cache.mkdir(parents=True, exist_ok=True)
    _repo_root(cache, "org/moved").symlink_to(_repo_root(elsewhere, "org/moved"))
    with pytest.raises(SourceError) as e:
        Source.parse("hf-hub:org/moved").folder()
    refused(e, "links out of the cache")


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
def test_blob_whose_content_does_not_match_its_hash_is_refused(cache, damage):
    snapshot = add_repo(cache, "org/damaged", tiny_vit_files())
    blob = Path(os.path.realpath(snapshot / "model.safetensors"))
    data = bytearray(blob.read_bytes())
    if damage == "flip":
        data[-1] ^= 0x01  # an array value: still a valid safetensors file
    elif damage == "truncate":
        data = data[:-4]
    else:
        data += b"\0" * 4
    blob.write_bytes(bytes(data))
    with pytest.raises(REFUSED) as e:
        zoo.create("hf-hub:org/damaged", "nnx", pretrained=True)
    refused(e, "model.safetensors: its content", "does not match its hash")


def test_small_file_checked_by_its_git_hash(cache):
    snapshot = add_repo(cache, "org/config-changed", tiny_vit_files())
    blob = Path(os.path.realpath(snapshot / "config.json"))
    assert blob.name == blob_name("config.json", blob.read_bytes())
    blob.write_text(blob.read_text().replace('"num_classes": 5', '"num_classes": 6', 1))
    with pytest.raises(REFUSED) as e:
        zoo.create("hf-hub:org/config-changed", "nnx", pretrained=True)
    refused(e, "config.json: its content", "does not match its hash")


def test_size_against_the_commits_tree_listing(cache):
    snapshot = add_repo(cache, "org/listed", tiny_vit_files(), tree_listing=True)
    zoo.create("hf-hub:org/listed", "nnx", pretrained=True)  # listing and files agree
    commit = snapshot.name
    tree = _repo_root(cache, "org/listed") / "trees" / f"{commit}.json"
    listing = json.loads(tree.read_text())
    listing["files"]["model.safetensors"]["lfs_size"] += 1
    tree.write_text(json.dumps(listing))
    with pytest.raises(REFUSED) as e:
        zoo.create("hf-hub:org/listed", "nnx", pretrained=True)
    refused(e, "the commit's tree listing says", "truncated or changed")


def test_cache_entries_that_are_no_regular_files_are_refused(cache):
    snapshot = add_repo(cache, "org/odd", tiny_vit_files())
    blob = Path(os.path.realpath(snapshot / "model.safetensors"))
    blob.unlink()
    blob.mkdir()
    with pytest.raises(REFUSED) as e:
        zoo.create("hf-hub:org/odd", "nnx", pretrained=True)
    refused(e, "not a regular file")


@pytest.mark.parametrize("shard", ["../model.safetensors", "/etc/passwd", "sub/x.safetensors",
                                   "..", "x\x00.safetensors"])
def test_shard_index_naming_paths_is_refused(cache, shard):
    files = tiny_vit_files()
    index = {"metadata": {}, "weight_map": {"cls_token": shard}}
    add_repo(cache, "org/sharded", {"config.json": files["config.json"],
                                    "model.safetensors.index.json": json.dumps(index).encode()})
    with pytest.raises(REFUSED) as e:
        zoo.create("hf-hub:org/sharded", "nnx", pretrained=True)
    refused(e, "is not a plain file name")


def _code_running_pickle() -> bytes:
    """A torch.save zip whose pickle calls os.system: what weights_only must refuse."""

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > /tmp/zoo-hub-pwned",))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": Evil()}, protocol=2))
        z.writestr("archive/version", "3\n")
        z.writestr("archive/byteorder", "little")
    return buf.getvalue()


def test_no_code_from_the_hub_runs(cache):
    pytest.importorskip("torch")
    files = tiny_vit_files()
    add_repo(cache, "org/evil", {"config.json": files["config.json"],
                                 "pytorch_model.bin": _code_running_pickle()})
    with pytest.raises(REFUSED) as e:
        zoo.create("hf-hub:org/evil", "nnx", pretrained=True)
    assert "os.system" in str(e.value) or "Unsupported global" in str(e.value) or \
        "posix.system" in str(e.value), str(e.value)
    assert not Path("/tmp/zoo-hub-pwned").exists()


def test_nothing_outside_the_cache_is_written(cache, tmp_path):
    add_repo(cache, "org/tiny-vit", tiny_vit_files())

    def tree():
        return {str(p): p.stat().st_mtime_ns for p in tmp_path.rglob("*")}

    before = tree()
    zoo.create("hf-hub:org/tiny-vit", "eqx", pretrained=True)
    assert tree() == before  # offline: the cache is read, nothing anywhere is written


def test_local_dir_sources(tmp_path):
    with pytest.raises(SourceError) as e:
        Source.parse(f"local-dir:{tmp_path / 'absent'}").folder()
    refused(e, "not a folder")
    folder = tmp_path / "folder"
    folder.mkdir()
    for name, data in tiny_vit_files().items():
        (folder / name).write_bytes(data)
    assert zoo.create(f"local-dir:{folder}", "nnx", pretrained=True).config == VIT
    with pytest.raises(UsageError):
        from converters.checkpoints.sources import source_config

        source_config(str(folder))
