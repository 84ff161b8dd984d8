"""The pretrained tag table (`zoo/weights/pretrained/data/tags.json`) and the ImageNet-1k names are
data generated from the zoo's registry and timm's: the committed files must equal what
``python -m zoo.weights.pretrained.generate`` makes now, every tag must carry what timm's
`get_pretrained_cfg` says, every named model timm publishes weights for must have all its
tags, and names with tags resolve as timm's do (an untagged name takes timm's default tag).
"""

from __future__ import annotations

import json

import pytest

import zoo
from tests.toy_architecture import ToyConfig
from zoo.configs import CONFIGS, ConfigError
from zoo.weights.pretrained import generate, table

timm = pytest.importorskip("timm")

FIELDS_FROM_TIMM = ("num_classes", "input_size", "test_input_size", "fixed_input_size",
                    "interpolation", "crop_pct", "test_crop_pct", "crop_mode", "mean", "std",
                    "license")


def plain(value):
    return [plain(v) for v in value] if isinstance(value, tuple | list) else value


def test_committed_table_is_what_the_generator_makes_now():
    fresh = generate.generate()
    stale = generate.differences(table.table(), fresh)
    assert not stale, (f"the tag table is stale: run `{table.GENERATE}`\n" + "\n".join(stale))
    assert generate.dump(fresh).count("\n") == table.TABLE.read_text().count("\n")


def test_generator_check_passes(capsys):
    assert generate.main(["--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_every_tag_is_timms():
    """Each field of each tag against timm's registry, read afresh (not through the
    generator), and the default tag is timm's."""
    from timm.data import infer_imagenet_subset
    from timm.models import get_pretrained_cfg

    checked = 0
    for name, entry in table.models().items():
        if entry["tags"][entry["default"]]["library"] != "timm":
            continue
        assert entry["default"] == get_pretrained_cfg(name).tag, name
        assert next(iter(entry["tags"])) == entry["default"]
        for tag, fields in entry["tags"].items():
            cfg = get_pretrained_cfg(f"{name}.{tag}").to_dict()
            # timm's repository of the tag (a twin may share another's: CLIP's _quickgelu names)
            assert fields["hub"] == cfg["hf_hub_id"] and fields["hub"].startswith("timm/")
            assert fields["file"] == (cfg.get("hf_hub_filename") or "model.safetensors")
            for key in FIELDS_FROM_TIMM:
                assert fields[key] == plain(cfg.get(key)), (f"{name}.{tag}", key)
            subset = infer_imagenet_subset(cfg) if cfg["num_classes"] else None
            assert fields["label_set"] == subset, f"{name}.{tag}"
            checked += 1
    assert checked >= 99  # ResNets and ViTs: 99 tags with timm 1.0.31


def test_every_named_model_timm_publishes_has_all_its_tags():
    on_hub = {}
    for name in zoo.names.named_models():
        if timm.models.is_model(name):
            tags = [t for t in timm.models.list_pretrained(f"{name}.*")
                    if timm.models.get_pretrained_cfg(t).hf_hub_id]
            if tags:
                on_hub[name] = sorted(t.partition(".")[2] for t in tags)
    from_timm = {n: sorted(e["tags"]) for n, e in table.models().items()
                 if e["tags"][e["default"]]["library"] == "timm"}
    assert from_timm == on_hub
    assert "resnet20-cifar" not in table.models()  # no weights published


def test_label_names_are_timms_imagenet_1k():
    from timm.data import ImageNetInfo

    data = json.loads((table.TABLE.parent / "imagenet-1k.json").read_text())
    info = ImageNetInfo("imagenet-1k")
    assert data["synsets"] == list(info.label_names())
    assert list(zoo.labels("imagenet-1k")) == list(info.label_descriptions())
    assert len(data["names"]) == 1000 and data["names"][0] == "tench, Tinca tinca"
    assert zoo.labels("resnet50.tv_in1k")[207] == "golden retriever"
    assert len(zoo.labels("vit_base_patch16_224.augreg_in21k")) == 21843  # from timm


def test_names_with_tags_set_what_timms_tags_set():
    assert zoo.make_config("resnet50.a3_in1k").input_size == (160, 160)
    assert zoo.make_config("resnet50.a3_in1k").layers == (3, 4, 6, 3)
    assert zoo.make_config("vit_base_patch16_224.augreg_in21k").num_classes == 21843
    assert zoo.make_config("vit_base_patch16_384.augreg_in1k").image_size == (384, 384)
    assert zoo.make_config("resnet50.tv_in1k", num_classes=10).num_classes == 10
    resolved = zoo.weights.pretrained.resolve("vit_small_patch16_224")
    assert str(resolved.pretrained) == "vit_small_patch16_224.augreg_in21k_ft_in1k"
    assert resolved.weights == "hf-hub:timm/vit_small_patch16_224.augreg_in21k_ft_in1k"


@pytest.mark.parametrize("name, said", [
    ("resnet50.tv_in1", "resnet50 has no pretrained tag 'tv_in1': did you mean "
                        "'resnet50.tv_in1k'"),
    ("resnet20-cifar.tv_in1k", "resnet20-cifar has no pretrained tags"),
    ("resnet5.tv_in1k", "unknown model 'resnet5.tv_in1k'"),
])
def test_unknown_tags_are_refused_in_one_line(name, said):
    with pytest.raises(ConfigError) as e:
        zoo.make_config(name)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_pretrained_without_tags_or_classifier_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="resnet20-cifar has no pretrained weights"):
        zoo.create("resnet20-cifar", "nnx", pretrained=True)
    with pytest.raises(ConfigError, match=r"have no classifier .*pass num_classes=N"):
        zoo.create("vit_small_patch16_224.dino", "nnx", pretrained=True)
    with pytest.raises(ConfigError, match="not both"):
        zoo.create("resnet18", "nnx", pretrained=True, weights={})


def test_list_pretrained_matches_as_timms():
    zoo_names = set(zoo.list_models())
    theirs = [n for n in timm.models.list_pretrained("vit_small*")
              if n.partition(".")[0] in zoo_names]
    assert zoo.list_pretrained("vit_small*") == sorted(theirs)
    assert zoo.list_pretrained("resnet50") == sorted(timm.models.list_pretrained("resnet50"))
    assert zoo.list_pretrained("*.tv_in1k") == [f"{n}.tv_in1k" for n in (
        "resnet101", "resnet152", "resnet18", "resnet34", "resnet50", "resnext50_32x4d",
        "wide_resnet50_2")]


def test_declared_hub_repositories_join_the_table(monkeypatch):
    """A named model timm does not know (a language model) declares its Hub repositories in
    its config's `HUB_REPOS`: regenerating puts them in the table, the first tag the
    default; names with dots of their own ("toy-lm-0.5b") keep them."""
    monkeypatch.setattr(ToyConfig, "NAMED", {"toy-lm-0.5b": {"width": 4}})
    monkeypatch.setattr(ToyConfig, "HUB_REPOS", {"toy-lm-0.5b": {
        "base": "Org/Toy-0.5B", "instruct": "Org/Toy-0.5B-Instruct@v1.0"}})
    fresh = generate.generate()
    entry = fresh["models"]["toy-lm-0.5b"]
    assert entry["arch"] == "toy" and entry["default"] == "base"
    assert entry["tags"]["instruct"]["hub"] == "Org/Toy-0.5B-Instruct@v1.0"
    assert entry["tags"]["base"]["library"] == "transformers"
    assert generate.differences(table.table(), fresh) == ["toy-lm-0.5b: not in the committed "
                                                           "table"]
    monkeypatch.setattr(table, "table", lambda: fresh)
    assert zoo.make_config("toy-lm-0.5b.instruct").width == 4
    assert zoo.weights.pretrained.resolve("toy-lm-0.5b").weights == "hf-hub:Org/Toy-0.5B"
    assert (zoo.weights.pretrained.resolve("toy-lm-0.5b.instruct").weights
            == "hf-hub:Org/Toy-0.5B-Instruct@v1.0")
    assert zoo.list_pretrained("toy-lm*") == ["toy-lm-0.5b.base", "toy-lm-0.5b.instruct"]
    monkeypatch.setattr(ToyConfig, "HUB_REPOS", {"toy-lm-7b": {"base": "Org/Toy-7B"}})
    with pytest.raises(ConfigError, match="neither toy nor one of its named models"):
        generate.generate()


def test_every_config_class_declares_hub_repos_of_its_own_names():
    """A config's HUB_REPOS name its architecture (its default config: gpt2) or its named
    models, nothing else."""
    for arch, cls in CONFIGS.items():
        assert set(cls.HUB_REPOS) <= {arch, *cls.NAMED}, arch
