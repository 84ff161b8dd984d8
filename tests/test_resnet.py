"""ResNet: torchvision's parameter names and shapes, and torchvision / timm models converted.

The key list of torchvision's ResNet-18 and ResNet-50 is pinned in a fixture written from
torchvision's models (`tests/fixtures/named_torchvision_resnet.json`), so CI checks the names
without torchvision. Where torchvision or timm can be imported (the GPU image), their randomly
initialised ResNet-18 is converted into every JAX library and compared in eval and train mode.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import converters
import zoo
from tests.kind_cover import cover
from zoo.models.resnet.config import ResNetConfig
from zoo.registry import schema
from zoo.runtime import fast
from zoo.testing import assert_close

FIXTURE = {name: entry["state_dict"] for name, entry in json.loads(
    (Path(__file__).parent / "fixtures" / "named_torchvision_resnet.json").read_text())[
    "models"].items()}
PARAMETERS = {"resnet18": 11_689_512, "resnet50": 25_557_032}  # torchvision's published counts


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_fixture_matches_torchvision_published_sizes(name):
    keys = FIXTURE[name]
    trained = [k for k in keys if not k.rsplit(".", 1)[1].startswith(("running", "num_batches"))]
    assert sum(math.prod(keys[k]) for k in trained) == PARAMETERS[name]
    assert {"conv1.weight", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.running_var",
            "fc.bias"} <= set(keys)


@pytest.mark.parametrize("impl", zoo.IMPLS)
@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_named_configs_have_torchvision_keys_and_shapes(name, impl):
    """The zoo's resnet18 / resnet50 give exactly torchvision's canonical keys and shapes in
    every library (input size does not change them: a small one keeps the tracing cheap)."""
    if impl == "torch":
        pytest.importorskip("torch")
    config = ResNetConfig.named(name, input_size=(32, 32))
    spec = schema(config, impl)[1]
    assert {k: list(v.shape) for k, v in spec.items()} == FIXTURE[name]


def test_torch_module_order_is_torchvision_state_dict_order():
    pytest.importorskip("torch")
    model = zoo.create(ResNetConfig.named("resnet18", input_size=(32, 32)), "torch")
    assert list(model.state_dict()) == list(FIXTURE["resnet18"])


@pytest.mark.parametrize(("overrides", "match"), [
    ({"layers": (2, 2), "widths": (4, 8, 16)}, "one per stage"),
    ({"layers": (1, 1, 1, 1, 1), "widths": (1, 1, 1, 1, 1)}, "1 to 4 entries"),
    ({"block": "wide"}, "ResNetConfig.block"),
    ({"stem": "tiny"}, "ResNetConfig.stem"),
    ({"layers": (0, 1), "widths": (4, 8)}, "positive"),
    ({"bn_momentum": 1.0}, "bn_momentum"),
    ({"groups": 2}, "a basic block has groups=1"),
    ({"block": "bottleneck", "width_per_group": 4}, "leaves no channel per group"),
    ({"block": "bottleneck", "groups": 0}, "positive"),
])
def test_bad_configs_are_refused_in_one_line(overrides, match):
    with pytest.raises(zoo.ConfigError, match=match) as info:
        zoo.tiny_config("resnet", **overrides)
    assert "\n" not in str(info.value)


def test_named_configs():
    assert ResNetConfig.named("resnet50").stages()[0][0].downsample  # 64 -> 256 in layer1.0
    with pytest.raises(zoo.ConfigError, match="no named config 'resnet7'"):
        ResNetConfig.named("resnet7")


def _randomise(model, torch):
    """Random BatchNorm statistics and affine parameters, so that eval mode proves something."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=g))
                m.weight.copy_(1 + 0.1 * torch.randn(m.num_features, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.num_features, generator=g))
    return model


def _independent(source: str, num_classes: int):
    if source == "torchvision":
        tv = pytest.importorskip("torchvision", reason="torchvision is not installed (CPU CI); "
                                 "the GPU image has it")
        return tv.models.resnet18(weights=None, num_classes=num_classes)
    timm = pytest.importorskip("timm", reason="timm is not installed (CPU CI); the GPU image "
                               "has it")
    return timm.create_model("resnet18", pretrained=False, num_classes=num_classes)


# Each source in one JAX library, the libraries in turn (--exhaustive: every pair).
@pytest.mark.parametrize(("source", "impl"), cover(["torchvision", "timm"], zoo.JAX_IMPLS,
                                                   per_case=2))
def test_independent_resnet18_converts_with_no_mapping(source, impl):
    """A torchvision (or timm) ResNet-18's state_dict loads into the zoo's resnet18 config as it
    is, and the JAX model computes the same logits in eval and in train mode."""
    torch = pytest.importorskip("torch")
    reference = _randomise(_independent(source, 10), torch)
    config = ResNetConfig.named("resnet18", num_classes=10, input_size=(64, 64))
    model = converters.from_canonical(reference.state_dict(), config, impl)
    api = zoo.interface(impl)
    x = np.array(zoo.example_input(config, batch=4, seed=5))  # writable, for torch
    for train in (False, True):
        with torch.no_grad():
            want = reference.train(train)(torch.from_numpy(x)).numpy()
        y = fast.forward(model, impl, train=train)(api.to_native(x))
        got = np.asarray(api.to_canonical(y[0] if train else y))
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 1e-4, f"{source} -> {impl}, train={train}: relative error {err:.2e}"


@pytest.mark.parametrize("impl", zoo.JAX_IMPLS)
def test_other_input_sizes_as_torchvision(impl, tmp_path):
    """A size is not a contract for a model that pools globally: a ResNet loaded from a
    torchvision checkpoint (`converters.load`) for 224x224 runs 1x1, 33x33 and 64x48 batches
    and gives torchvision's logits, in eval mode."""
    torch = pytest.importorskip("torch")
    tv = pytest.importorskip("torchvision")
    reference = _randomise(tv.models.resnet.ResNet(tv.models.resnet.BasicBlock, [1, 1, 1, 1],
                                                   num_classes=10), torch).eval()
    path = tmp_path / "resnet.pt"
    torch.save(reference.state_dict(), path)
    config = ResNetConfig(layers=(1, 1, 1, 1), num_classes=10)
    model = converters.load(path, impl, config=config)
    api = zoo.interface(impl)
    for shape in ((2, 3, 1, 1), (2, 3, 33, 33), (2, 3, 64, 48)):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            want = reference(torch.from_numpy(x)).numpy()
        got = np.asarray(api.to_canonical(api.forward(model, api.to_native(x))))
        assert_close(got, want)
