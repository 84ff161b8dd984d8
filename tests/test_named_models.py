"""Named models ("resnet50", "vit_small_patch16_224"): resolved everywhere a config is asked
for, and each pinned to its reference library.

`tests/fixtures/named_*.json` hold every name's state_dict keys, shapes and parameter count as
torchvision / timm build them; regenerate them with `python -m tests.test_named_models` where
torchvision and timm are installed (the reference models are built on PyTorch's meta device: no
weights, no download). The zoo's canonical spec of every name is checked against them from the
abstract skeleton (no weights either), and where the references are installed the fixtures are
checked against the references themselves, every name cut to one block per stage gives the
reference's logits in PyTorch, and the small models (resnet18, resnext50_32x4d,
vit_tiny_patch16_224) are forward-equal to them in every library.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import converters
import zoo
from canonical import KINDS
from converters.checkpoints import parse_config
from converters.checkpoints.api import as_checkpoint
from tests.kind_cover import by_options, cover
from zoo.registry import schema
from zoo.runtime import fast
from zoo.testing import pinned_fact

FIXTURES = Path(__file__).parent / "fixtures"
# fixture -> (reference library, its names, the reference's arguments: a 1000-class head, or
# timm's own default head for the published towers: none for DINOv2 and SigLIP, the image
# projection for OpenAI's CLIP)
FAMILIES = {
    "named_torchvision_resnet.json": ("torchvision", (
        "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
        "wide_resnet50_2"), {"num_classes": 1000}),
    "named_timm_vit.json": ("timm", r"vit_(tiny|small|base|large)_patch(16|32)_(224|384)",
                            {"num_classes": 1000}),
    "named_timm_mbconv.json": ("timm", (
        *(f"{tf}efficientnet_b{i}" for tf in ("", "tf_") for i in range(5)),
        "mobilenetv3_large_100", "mobilenetv3_small_100"), {"num_classes": 1000}),
    "named_timm_vit_towers.json": ("timm", (
        "vit_small_patch14_dinov2", "vit_base_patch14_dinov2", "vit_giant_patch14_dinov2",
        "vit_small_patch14_reg4_dinov2", "vit_base_patch14_reg4_dinov2",
        "vit_giant_patch14_reg4_dinov2", "vit_base_patch16_clip_224",
        "vit_large_patch14_clip_224", "vit_base_patch16_clip_quickgelu_224",
        "vit_large_patch14_clip_quickgelu_224", "vit_base_patch16_siglip_224",
        "vit_so400m_patch14_siglip_384", "deit_tiny_patch16_224", "deit_small_patch16_224",
        "deit_base_patch16_224", "deit_base_patch16_384", "deit_tiny_distilled_patch16_224",
        "deit_small_distilled_patch16_224", "deit_base_distilled_patch16_224",
        "deit_base_distilled_patch16_384"), {}),
    "named_timm_swin.json": ("timm", (
        "swin_tiny_patch4_window7_224", "swin_small_patch4_window7_224",
        "swin_base_patch4_window7_224", "swin_base_patch4_window12_384"), {"num_classes": 1000}),
}
SMALL = {"resnet18": {"input_size": (64, 64)}, "resnext50_32x4d": {"input_size": (32, 32)},
         "vit_tiny_patch16_224": {}}


RESNETS = FAMILIES["named_torchvision_resnet.json"][1]
MBCONV = FAMILIES["named_timm_mbconv.json"][1]  # EfficientNet, MobileNetV3: test_mbconv.py
# the zoo's names of the pinned families (torchvision's mobilenet_v3_* are pinned through their
# layout, test_mbconv.py)
NAMES = [*RESNETS, *zoo.list_models("vit_*"), *zoo.list_models("deit_*"),
         *zoo.list_models("swin_*"), *MBCONV]
LIBRARY = {name: library for library, names, _ in FAMILIES.values()
           for name in (names if isinstance(names, tuple) else ())}


def _load(fixture: str) -> dict:
    return json.loads((FIXTURES / fixture).read_text())["models"]


@functools.cache
def pinned() -> dict[str, dict]:
    """Every fixture's models: name -> {"params", "state_dict"}."""
    return {name: entry for fixture in FAMILIES for name, entry in _load(fixture).items()}


# --------------------------------------------------------------------------- the references
def _reference_names(library: str, names) -> list[str]:
    if isinstance(names, tuple):
        return list(names)
    import timm

    return [n for n in timm.list_models("vit_*") if re.fullmatch(names, n)]


def reference_model(library: str, name: str, **kwargs):
    """torchvision's or timm's model `name`, random weights (never a download)."""
    if library == "torchvision":
        import torchvision

        return torchvision.models.get_model(name, weights=None, **kwargs)
    import timm

    return timm.create_model(name, pretrained=False, **kwargs)


def reference_entry(library: str, name: str, **kwargs) -> dict:
    """{"params": trainable parameter count, "state_dict": {key: shape}} of the reference built
    with `kwargs` (a 1000-class head: timm serves vit_large_patch32_224 without one), on the
    meta device."""
    import torch

    with torch.device("meta"):
        model = reference_model(library, name, **kwargs)
    return {"params": sum(p.numel() for p in model.parameters()),
            "state_dict": {k: list(v.shape) for k, v in model.state_dict().items()}}


def _dump(source: str, models: dict) -> str:
    """JSON with one state_dict key per line (readable diffs)."""
    lines = ["{", f' "source": {json.dumps(source)},', ' "models": {']
    for i, (name, entry) in enumerate(models.items()):
        keys = [f'    {json.dumps(k)}: {json.dumps(s)}' for k, s in entry["state_dict"].items()]
        lines += [f'  {json.dumps(name)}: {{', f'   "params": {entry["params"]},',
                  '   "state_dict": {', ",\n".join(keys), "   }",
                  "  }" + ("," if i < len(models) - 1 else "")]
    return "\n".join([*lines, " }", "}", ""])


def write_fixtures(only: str | None = None) -> None:
    """Write every fixture (or the one called `only`)."""
    import timm
    import torchvision

    versions = {"torchvision": torchvision.__version__, "timm": timm.__version__}
    for fixture, (library, names, kwargs) in FAMILIES.items():
        if only not in (None, fixture):
            continue
        models = {n: reference_entry(library, n, **kwargs)
                  for n in _reference_names(library, names)}
        args = ", ".join(f"{k}={v}" for k, v in kwargs.items()) or "timm's default head"
        source = (f"{library} {versions[library]} models(weights=None / pretrained=False, "
                  f"{args}) on the meta device: trainable parameter count and "
                  "state_dict key -> shape; written by `python -m tests.test_named_models`")
        (FIXTURES / fixture).write_text(_dump(source, models))


# --------------------------------------------------------------------------- names resolve
def test_every_pinned_name_is_a_zoo_model_and_back():
    assert set(pinned()) == set(NAMES)
    assert set(RESNETS) <= set(zoo.list_models())


def test_names_resolve_in_python_and_on_the_command_line():
    config = zoo.make_config("resnext50_32x4d", num_classes=10)
    assert (config.arch, config.groups, config.width_per_group, config.num_classes) == (
        "resnet", 32, 4, 10)
    assert parse_config("resnext50_32x4d", '{"num_classes": 10}') == config
    assert parse_config("vit", None) == zoo.make_config("vit")  # an architecture still works
    assert as_checkpoint({}, config="resnext50_32x4d").config == zoo.make_config(
        "resnext50_32x4d")
    assert zoo.make_config("vit_small_patch16_224").width == 384
    assert zoo.list_models("vit_tiny_*") == ["vit_tiny_patch16_224", "vit_tiny_patch16_384"]
    assert "cnn" in zoo.list_models() and zoo.list_models("nothing*") == []
    assert ("resnet", "nnx") in zoo.list_implementations()


@pytest.mark.parametrize("bad", ["resnet5O", "vit_small_patch16_244"])
def test_an_unknown_name_is_refused_in_one_line_with_close_matches(bad):
    for make in (zoo.make_config, lambda n: parse_config(n, None)):
        with pytest.raises(zoo.ConfigError, match=rf"unknown model '{bad}': did you mean") as e:
            make(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(zoo.ConfigError, match=r"zoo\.list_models"):
        zoo.make_config("xyzzy")


def test_converters_cli_takes_a_name_for_arch(tmp_path):
    """`--arch resnet18` converts a torchvision-layout file; a misspelt name is a one-line
    usage error with the closest names."""
    torch = pytest.importorskip("torch")
    from converters.__main__ import main

    config = zoo.make_config("resnet18", input_size=(32, 32), num_classes=10)
    src = tmp_path / "resnet18.pt"
    torch.save(zoo.create(config, "torch").state_dict(), src)
    small = '{"input_size": [32, 32], "num_classes": 10}'
    assert main(["convert", str(src), str(tmp_path / "nnx"), "--to", "nnx", "--arch",
                 "resnet18", "--config", small]) == 0
    assert main(["inspect", str(tmp_path / "nnx")]) == 0
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["convert", str(src), str(tmp_path / "bad"), "--to", "nnx", "--arch",
                     "resnet5O"])
    assert code == 2 and err.getvalue().strip().splitlines() == [
        "error: unknown model 'resnet5O': did you mean 'resnet50' or 'resnet' or 'resnet152'?"]


def test_a_name_is_a_config_and_overrides_apply_on_top():
    model = zoo.create("resnet18", "nnx", num_classes=3, input_size=(32, 32))
    assert model.fc.out_features == 3 and model.config.layers == (2, 2, 2, 2)


# --------------------------------------------------------------------------- pinned specs
def _trainable(spec: dict, layers: list) -> int:
    buffers = {f"{layer.name}.{b}" for layer in layers for b in KINDS[layer.kind].buffers}
    return sum(math.prod(v.shape) for k, v in spec.items() if k not in buffers)


@pytest.mark.parametrize("name", NAMES)
def test_named_config_has_the_references_keys_shapes_and_parameter_count(name):
    """From the abstract skeleton: no weights are built. A ResNet's, EfficientNet's or
    MobileNetV3's keys and shapes do not depend on its input size: a small one keeps the
    tracing cheap."""
    small = name in RESNETS or name in MBCONV
    layers, spec = schema(zoo.make_config(name, **({"input_size": (32, 32)} if small else {})))
    assert {k: list(v.shape) for k, v in spec.items()} == pinned()[name]["state_dict"]
    assert _trainable(spec, layers) == pinned()[name]["params"]


@pytest.mark.parametrize("fixture", sorted(FAMILIES))
def test_fixtures_are_the_references(fixture):
    """The committed fixture is what the installed reference library builds."""
    library, names, kwargs = FAMILIES[fixture]
    pytest.importorskip("torch")
    pytest.importorskip(library)
    want = {n: reference_entry(library, n, **kwargs) for n in _reference_names(library, names)}
    with pinned_fact(library, "torch"):
        assert _load(fixture) == want


# --------------------------------------------------------------------------- live forward
@functools.cache
def _reference_forward(name: str):
    """(reference state_dict, input, eval-mode logits) of a randomised reference model."""
    torch = pytest.importorskip("torch")
    library = LIBRARY.get(name, "timm")
    pytest.importorskip(library)
    torch.manual_seed(0)
    model = reference_model(library, name, num_classes=10)
    with torch.no_grad():  # perturb every array (zero biases, unit BN statistics otherwise)
        for k, v in model.state_dict().items():
            if v.is_floating_point():
                v.add_(0.05 * torch.rand_like(v) if "running_var" in k else
                       0.05 * torch.randn_like(v))
    config = zoo.make_config(name, num_classes=10, **SMALL[name])
    x = np.array(zoo.example_input(config, batch=2, seed=1))
    with torch.no_grad():
        y = model.eval()(torch.from_numpy(x)).numpy()
    return model.state_dict(), config, x, y


@pytest.mark.parametrize(("name", "impl"), cover(sorted(SMALL), zoo.IMPLS, per_case=2))
def test_small_named_models_compute_the_references_logits(name, impl):
    """The reference's state_dict loads into the named config as it is and gives the same
    logits (eval mode) in every library."""
    state, config, x, want = _reference_forward(name)
    model = converters.from_canonical(state, config, impl)
    if impl == "torch":
        import torch

        with torch.no_grad():
            got = model.eval()(torch.from_numpy(x)).numpy()
    else:
        api = zoo.interface(impl)
        got = np.asarray(api.to_canonical(fast.forward(model, impl)(api.to_native(x))))
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-5, f"{name} {impl}: relative error {err:.2e}"


# Every name at one block per stage: the blocks of a stage compute the same function, so this
# checks each name's hyperparameters that shapes cannot show (heads, eps, strides, pooling,
# groups) at a fraction of the cost; the full depth is pinned by the fixtures above. ViTs run
# at 4x4 patches (the image size changes the position embedding's length only); Swin keeps two
# blocks per stage (the second one's windows are shifted) at its own size (it sets the windows).
def _cut_resnet(model) -> None:
    for stage in ("layer1", "layer2", "layer3", "layer4"):
        setattr(model, stage, getattr(model, stage)[:1])


def _cut_vit(model) -> None:
    model.blocks = model.blocks[:1]


def _cut_swin(model) -> None:
    for stage in model.layers:
        stage.blocks = stage.blocks[:2]


ONE_BLOCK = {"resnet": ("layers", (1, 1, 1, 1), _cut_resnet), "vit": ("depth", 1, _cut_vit),
             "swin": ("depths", (2, 2, 2, 2), _cut_swin)}


def _small_image(arch: str, name: str) -> dict:
    """The zoo's size arguments of the one-block check."""
    if arch == "resnet":
        return {"input_size": (64, 64)}
    if arch == "vit":
        side = 4 * zoo.make_config(name).patch_size
        return {"image_size": (side, side)}
    return {}


def _one_block_reference(library: str, name: str):
    """The reference `name` cut to its first block(s) per stage, random weights (built on the
    meta device, then filled: every array perturbed, BatchNorm variances positive; the
    buffers timm derives, recomputed)."""
    import torch

    arch = zoo.make_config(name).arch
    size = _small_image(arch, name)
    size = {"img_size": size["image_size"]} if "image_size" in size else {}
    with torch.device("meta"):
        model = reference_model(library, name, num_classes=10, **size)
    ONE_BLOCK[arch][2](model)
    model = model.to_empty(device="cpu")
    for module in model.modules():  # timm's derived (non-persistent) buffers
        if hasattr(module, "init_non_persistent_buffers"):
            module.init_non_persistent_buffers()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if not value.is_floating_point():
                value.zero_()
            elif "running_var" in key:
                value.copy_(0.5 + torch.rand(value.shape, generator=generator))
            else:
                value.copy_(0.05 * torch.randn(value.shape, generator=generator))
    return model.eval()


# Each name's keys and shapes are pinned above; computing, a name differing from an earlier
# one only in sizes adds nothing (tests.kind_cover.by_options; --exhaustive: every name).
@pytest.mark.parametrize("name", by_options([n for n in NAMES if n not in MBCONV]))  # mbconv:
def test_every_name_at_one_block_per_stage_computes_the_references_logits(name):  # its file
    """The zoo's PyTorch model of a named config, cut to one block per stage as the
    reference is, loads the reference's state_dict strictly and gives its logits; the JAX
    libraries equal the zoo's PyTorch model on every config (test_equivalence)."""
    torch = pytest.importorskip("torch")
    library = LIBRARY.get(name, "timm")
    pytest.importorskip(library)
    arch = zoo.make_config(name).arch
    field, value, _ = ONE_BLOCK[arch]
    reference = _one_block_reference(library, name)
    config = zoo.make_config(name, num_classes=10, **{field: value}, **_small_image(arch, name))
    model = converters.from_canonical(reference.state_dict(), config, "torch").eval()
    x = torch.from_numpy(np.array(zoo.example_input(config, batch=1, seed=1)))
    with torch.no_grad():
        want, got = reference(x), model(x)
    err = float((got - want).abs().max() / want.abs().max())
    assert err < 1e-6, f"{name}: relative error {err:.2e}"


if __name__ == "__main__":
    import sys

    write_fixtures(*sys.argv[1:2])
