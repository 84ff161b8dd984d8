"""`pretrained=True` from a Hugging Face cache equals timm (and transformers) loading the same
cache, in every library.

The cache is laid out by the tests (`tests/hub_cache.py`) from files they make: timm models with
random weights (BatchNorm statistics perturbed) saved by timm's own `save_for_hf`
(``config.json`` + ``model.safetensors``), reduced to keep the suite small (a ResNet-18 of one
8- to 64-channel block per stage behind its 64-channel stem; a one-block, 64-wide ViT on 32x32
images: the tag's architecture with overrides that timm's `create_model` takes too), and
transformers folders written by `save_pretrained` (one file and sharded). Nothing reaches the
network: ``huggingface_hub`` runs offline and its constants point at the test's cache
(`offline_hub`; the library reads them at call time).

Each library's forward pass is compared with timm's once per architecture; the other paths
(untagged names, sources, revisions, file preference, the command line) compare the loaded
arrays with timm's bit for bit. `--quick` keeps the ViT's (the ResNet's are reference-model
features, as elsewhere), one transformers folder and the command line.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import converters
import zoo
from converters.matching.verify import max_difference, tolerance
from tests.converter_cli import cli
from tests.hub_cache import add_folder, add_repo, offline_hub
from zoo.testing import assert_close

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

IMPLS = ("eqx", "linen", "nnx", "torch")
RESNET = "resnet18.a1_in1k"
VIT = "vit_small_patch16_224.augreg_in21k_ft_in1k"
# The reduced architectures: the zoo's overrides and timm's create_model arguments.
SMALL = {"layers": (1, 1, 1, 1)}  # timm's plain ResNet stem is 64 wide whatever stem_width
ZOO_ARGS = {RESNET: {**SMALL, "widths": (8, 16, 32, 64)},
            VIT: {"depth": 1, "width": 64, "num_heads": 2, "image_size": (32, 32)}}
TIMM_ARGS = {RESNET: {**SMALL, "channels": (8, 16, 32, 64)},
             VIT: {"depth": 1, "embed_dim": 64, "num_heads": 2, "img_size": 32}}
INPUT = {RESNET: (2, 3, 32, 32), VIT: (2, 3, 32, 32)}
# GPT-2's tag (the configs' HUB_REPOS: OpenAI's release) over a reduced model
GPT2_ARGS = {"vocab_size": 96, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2}


def random_timm(name: str, seed: int = 0, **kwargs):
    """timm's `name` (untagged) with random weights and perturbed BatchNorm statistics."""
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, **kwargs).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    return model


def save_timm(model, folder, **kwargs):
    from timm.models import save_for_hf

    folder.mkdir(parents=True)
    save_for_hf(model, str(folder), **{"safe_serialization": True, **kwargs})
    return folder


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """The cache: the two tags' repositories (the ResNet also at revision v2, other weights),
    a tag with only pytorch_model.bin, one with both files (different weights), a headless
    tag, and two transformers ViT repositories (one file; shards)."""
    from transformers import ViTConfig, ViTForImageClassification

    cache = tmp_path_factory.mktemp("hf-cache")
    work = tmp_path_factory.mktemp("folders")
    for i, tag in enumerate((RESNET, VIT)):
        arch = tag.partition(".")[0]
        model = random_timm(arch, seed=i, **TIMM_ARGS[tag])
        add_folder(cache, f"timm/{tag}", save_timm(model, work / tag))
    v2 = random_timm("resnet18", seed=5, **TIMM_ARGS[RESNET])
    add_folder(cache, f"timm/{RESNET}", save_timm(v2, work / "v2"), revision="v2")
    bin_only = save_timm(random_timm("resnet18", seed=6, **TIMM_ARGS[RESNET]),
                         work / "bin", safe_serialization=False)
    add_folder(cache, "timm/resnet18.gluon_in1k", bin_only)
    both = save_timm(random_timm("resnet18", seed=7, **TIMM_ARGS[RESNET]), work / "both")
    add_repo(cache, "timm/resnet18.tv_in1k", {
        "config.json": both / "config.json", "model.safetensors": both / "model.safetensors",
        "pytorch_model.bin": bin_only / "pytorch_model.bin"})
    headless = random_timm("vit_small_patch16_224", seed=8, num_classes=0,
                           **TIMM_ARGS[VIT])
    add_folder(cache, "timm/vit_small_patch16_224.dino", save_timm(headless, work / "dino"))
    torch.manual_seed(9)
    hf = ViTForImageClassification(ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=32, patch_size=8, num_labels=5)).eval()
    hf.save_pretrained(work / "hf")
    add_folder(cache, "google/vit-tiny-test", work / "hf")
    hf.save_pretrained(work / "hf-sharded", max_shard_size="20KB")
    assert (work / "hf-sharded" / "model.safetensors.index.json").is_file()
    add_folder(cache, "google/vit-tiny-sharded", work / "hf-sharded")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(10)
    GPT2LMHeadModel(GPT2Config(**GPT2_ARGS)).eval().save_pretrained(work / "gpt2")
    add_folder(cache, "openai-community/gpt2", work / "gpt2")
    return cache


@pytest.fixture
def hub(monkeypatch, hub_cache):
    return offline_hub(monkeypatch, hub_cache)


def batch(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def run(model, impl, x):
    api = zoo.native_interface(impl)
    return np.asarray(api.to_canonical(api.forward(model, api.to_native(x))))


def timm_run(model, x):
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def assert_same_weights(model, impl, reference):
    """Every array of the zoo `model` is the torch `reference`'s, bit for bit (the forward
    equality of each library is `test_pretrained_equals_timm_on_the_same_cache`'s)."""
    state = converters.to_canonical(model, impl)
    want = reference.state_dict()
    assert set(state) == set(want)
    for key, value in want.items():
        np.testing.assert_array_equal(np.asarray(state[key]), value.numpy(), err_msg=key)


def timm_model(name, **kwargs):
    return timm.create_model(name, pretrained=True, **kwargs).eval()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("tag", [RESNET, VIT])
def test_pretrained_equals_timm_on_the_same_cache(hub, tag, impl):
    want_model = timm.create_model(tag, pretrained=True, **TIMM_ARGS[tag]).eval()
    x = batch(INPUT[tag])
    model = zoo.create(tag, impl, pretrained=True, **ZOO_ARGS[tag])
    assert max_difference(timm_run(want_model, x), run(model, impl, x)) <= tolerance()
    assert zoo.data_config(model) == timm.data.resolve_model_data_config(want_model)


@pytest.mark.full_only
def test_untagged_names_sources_and_local_folders(hub):
    """An untagged name takes timm's default tag; a source named as the model takes its
    config from config.json (and, without pretrained, only that); a local folder too."""
    want = timm_model(f"hf-hub:timm/{RESNET}")
    assert_same_weights(zoo.create("resnet18", "nnx", pretrained=True, **ZOO_ARGS[RESNET]),
                        "nnx", want)
    model = zoo.create(f"hf-hub:timm/{RESNET}", "nnx", pretrained=True)
    assert model.config.layers == (1, 1, 1, 1) and model.config.widths == (8, 16, 32, 64)
    assert_same_weights(model, "nnx", want)
    assert zoo.data_config(model) == zoo.data_config(RESNET)
    assert zoo.labels(model)[0] == "tench, Tinca tinca"
    folder = next((hub / f"models--timm--{RESNET}" / "snapshots").iterdir())
    assert_same_weights(zoo.create(f"local-dir:{folder}", "eqx", pretrained=True), "eqx", want)
    fresh = zoo.create(f"hf-hub:timm/{RESNET}", "nnx")  # the config only, canonical init
    assert fresh.config == model.config
    assert not np.array_equal(converters.to_canonical(fresh, "nnx")["fc.weight"],
                              want.fc.weight.detach().numpy())


@pytest.mark.full_only
def test_revisions(hub):
    v2 = timm_model(f"hf-hub:timm/{RESNET}@v2")
    assert not torch.equal(v2.fc.weight, timm_model(f"hf-hub:timm/{RESNET}").fc.weight)
    assert_same_weights(zoo.create(f"hf-hub:timm/{RESNET}@v2", "linen", pretrained=True),
                        "linen", v2)
    commit = (hub / f"models--timm--{RESNET}" / "refs" / "v2").read_text()
    assert_same_weights(zoo.create(f"hf-hub:timm/{RESNET}@{commit}", "linen",
                                   pretrained=True), "linen", v2)


@pytest.mark.full_only
def test_safetensors_before_pytorch_model_bin(hub):
    """A repository with both files gives the safetensors' weights (timm's preference); one
    with only pytorch_model.bin gives those (read with PyTorch's weights_only loader)."""
    for tag in ("resnet18.tv_in1k", "resnet18.gluon_in1k"):
        model = zoo.create(tag, "torch", pretrained=True, **ZOO_ARGS[RESNET])
        assert_same_weights(model, "torch", timm_model(tag, **TIMM_ARGS[RESNET]))
    both = hub / "models--timm--resnet18.tv_in1k" / "snapshots"
    assert {p.name for p in next(both.iterdir()).iterdir()} >= {"model.safetensors",
                                                                "pytorch_model.bin"}
    a, b = (timm_model(t, **TIMM_ARGS[RESNET]) for t in ("resnet18.tv_in1k",
                                                          "resnet18.gluon_in1k"))
    assert not torch.equal(a.fc.weight, b.fc.weight)  # the two files hold other weights


@pytest.mark.parametrize("repo, impl", [
    ("google/vit-tiny-test", "nnx"),
    pytest.param("google/vit-tiny-test", "torch", marks=pytest.mark.full_only),
    pytest.param("google/vit-tiny-sharded", "eqx", marks=pytest.mark.full_only)])
def test_transformers_folders_equal_transformers(hub, repo, impl):
    from transformers import ViTForImageClassification

    ref = ViTForImageClassification.from_pretrained(repo, cache_dir=str(hub),
                                                    local_files_only=True).eval()
    x = batch((2, 3, 32, 32))
    with torch.no_grad():
        want = ref(pixel_values=torch.from_numpy(x)).logits.numpy()
    model = zoo.create(f"hf-hub:{repo}", impl, pretrained=True)
    assert converters.config_of(model, impl).norm_eps == 1e-12  # transformers' default
    assert max_difference(want, run(model, impl, x)) <= tolerance()


@pytest.mark.parametrize("impl", [pytest.param(i, marks=() if i == "nnx" else pytest.mark.full_only)
                                  for i in IMPLS])
def test_language_model_tags_equal_transformers(hub, impl):
    """A tag the config declares (`HUB_REPOS`: gpt2.openai, OpenAI's repository) loads the
    transformers folder in every library (its tied head one array), with transformers' logits;
    a language model's tag asks for no classifier."""
    from transformers import GPT2LMHeadModel

    ref = GPT2LMHeadModel.from_pretrained("openai-community/gpt2", cache_dir=str(hub),
                                          local_files_only=True).eval()
    ids = np.random.default_rng(0).integers(0, GPT2_ARGS["vocab_size"], (2, 8))
    with torch.no_grad():
        want = ref(torch.from_numpy(ids)).logits.numpy()
    model = zoo.create("gpt2.openai", impl, pretrained=True, **GPT2_ARGS)
    api = zoo.native_interface(impl)
    got = np.asarray(api.forward(model, api.to_native(ids.astype(np.int32))))
    assert max_difference(want, got) <= tolerance()


@pytest.mark.full_only
def test_headless_weights_need_num_classes(hub):
    """timm's num_classes 0 (features only): the zoo's models end in a classifier, so one is
    asked for, drawn from the seed, and said; every other array is the checkpoint's."""
    tag = "vit_small_patch16_224.dino"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model = zoo.create(tag, "nnx", pretrained=True, num_classes=7, **ZOO_ARGS[VIT])
    assert any("re-initialised head for 7 classes" in str(w.message) for w in said)
    ref = timm_model(tag, num_classes=0, **TIMM_ARGS[VIT])
    state = converters.to_canonical(model, "nnx")
    for key, value in ref.state_dict().items():
        np.testing.assert_array_equal(np.asarray(state[key]), value.numpy(), err_msg=key)


def test_converters_command_line_takes_sources(hub, tmp_path, capsys):
    dst = tmp_path / "vit_nnx"
    code, out, err = cli(capsys, "convert", f"hf-hub:timm/{VIT}", dst, "--to", "nnx")
    assert code == 0, err
    assert f"fetched hf-hub:timm/{VIT}" in out and "timm hub folder" in out
    assert_same_weights(converters.load(dst, "nnx"), "nnx", timm_model(VIT, **TIMM_ARGS[VIT]))
    code, out, err = cli(capsys, "inspect", "hf-hub:google/vit-tiny-sharded")
    assert code == 0, err
    assert "hf-vit hub folder" in out and "loads into the zoo: yes" in out


@pytest.mark.full_only
def test_classify_gives_timms_probabilities(hub):
    from PIL import Image
    from sklearn.datasets import load_sample_images

    from zoo.predict import classify

    photo = Image.fromarray(load_sample_images().images[0])
    model = zoo.create(RESNET, "nnx", pretrained=True, **ZOO_ARGS[RESNET])
    got = classify(model, "nnx", photo, top=5)[0]
    ref = timm.create_model(RESNET, pretrained=True, **TIMM_ARGS[RESNET]).eval()
    x = timm.data.create_transform(**timm.data.resolve_model_data_config(ref))(photo)
    with torch.no_grad():
        probs = torch.softmax(ref(x[None]).double(), -1)[0].numpy()
    best = np.argsort(-probs)[:5]
    names = zoo.labels("imagenet-1k")
    assert [n for n, _ in got] == [names[i] for i in best]
    assert_close(np.array([p for _, p in got]), probs[best])
