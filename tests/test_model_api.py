"""The classifier API timm users expect, the same names in every library:
`forward_features(x)` (the feature map / tokens before pooling) and
`forward_head(features, pre_logits=...)`, for ResNet, ViT, ConvNeXt, EfficientNet and
MobileNetV3. Every library agrees
with the PyTorch reference on both, and the reference with timm's own models."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import converters
import zoo
from tests import compiled
from tests.conftest import HAVE_TORCH, torch_marked
from tests.kind_cover import cover
from tests.timm_mbconv import timm_model
from zoo.testing import assert_close

ARCHS = ("resnet", "vit", "convnext", "efficientnet", "mobilenetv3")
CASES = [(arch, zoo.tiny_config(arch)) for arch in ARCHS] + [
    (f"{arch}-{name}", zoo.tiny_config(arch, **over)) for arch in ARCHS
    for name, over in zoo.architecture(arch).config.VARIANTS.items()]


def _canonical(y: np.ndarray, impl: str, spatial: bool) -> np.ndarray:
    """A feature map in (N, C, H, W); tokens and vectors are the same in every library."""
    return np.asarray(zoo.native_interface(impl).to_canonical(y) if spatial else y)


def _outputs(model, impl: str, x: np.ndarray) -> dict[str, np.ndarray]:
    api = zoo.native_interface(impl)
    feats = compiled.call(model, impl, "forward_features", api.to_native(x))
    spatial = np.ndim(feats) == 4
    return {"features": _canonical(feats, impl, spatial),
            "pre_logits": np.asarray(compiled.call(model, impl, "forward_head", feats,
                                                   pre_logits=True)),
            "logits": np.asarray(compiled.call(model, impl, "forward_head", feats)),
            "forward": np.asarray(api.forward(model, api.to_native(x)))}


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize(("case", "config", "impl"), cover(
    CASES, zoo.JAX_IMPLS, ids=[c for c, _ in CASES]))
def test_features_and_head_agree_with_torch(case, config, impl):
    x = np.asarray(zoo.example_input(config, batch=2, seed=1))
    want = _outputs(zoo.create(config, "torch", seed=0), "torch", x)
    got = _outputs(zoo.create(config, impl, seed=0), impl, x)
    assert_close(want["logits"], want["forward"])  # head(features) is it
    assert want["pre_logits"].ndim == 2 and want["pre_logits"].shape != want["logits"].shape
    for k in want:
        assert_close(got[k], want[k], err_msg=f"{case} {impl} {k}")


@pytest.fixture(scope="module")
def timm_references():
    """timm's resnet18 (torchvision's keys) at 32x32, a one-block vit_tiny and a one-block-per-
    stage convnextv2_atto at 32x32 and timm's EfficientNet and MobileNetV3 of the tiny configs,
    random;
    (zoo config, state_dict, input, timm's features / pre-logits / logits) each."""
    torch = pytest.importorskip("torch")
    timm = pytest.importorskip("timm", reason="timm is not installed")
    torch.manual_seed(0)
    out = {}
    mbconv = [(None, {}, zoo.tiny_config(arch)) for arch in ("efficientnet", "mobilenetv3")]
    for name, kwargs, cfg in [
            ("resnet18", {}, zoo.make_config("resnet18", input_size=(32, 32))),
            ("vit_tiny_patch16_224", {"img_size": 32, "depth": 1},
             zoo.make_config("vit_tiny_patch16_224", image_size=(32, 32), depth=1)),
            ("convnextv2_atto", {"depths": (1, 1, 1, 1)},
             zoo.make_config("convnextv2_atto", depths=(1, 1, 1, 1), input_size=(32, 32))),
            *mbconv]:
        model = (timm.create_model(name, **kwargs) if name else timm_model(cfg)).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn_like(p))
            x = np.asarray(zoo.example_input(cfg, batch=2, seed=2))
            feats = model.forward_features(torch.from_numpy(x.copy()))
            want = {"features": feats.numpy(),
                    "pre_logits": model.forward_head(feats, pre_logits=True).numpy(),
                    "logits": model.forward_head(feats).numpy()}
        out[cfg.arch] = cfg, model.state_dict(), x, want
    return out


@pytest.mark.parametrize(("arch", "impl"), cover(ARCHS, torch_marked(zoo.IMPLS)))
def test_features_and_head_are_timms(arch, impl, timm_references):
    """Each timm model in one library, the libraries in turn (`--exhaustive`: in all)."""
    cfg, state, x, want = timm_references[arch]
    got = _outputs(converters.from_canonical(state, cfg, impl), impl, x)
    for k in want:
        assert_close(got[k], want[k], err_msg=f"{cfg.arch} {impl} {k}")


def _reset(model, impl: str, num_classes: int):
    """`reset_classifier` as each library offers it: a new model (Equinox, Linen) or the same
    one changed in place (NNX, PyTorch, as timm's)."""
    if impl == "torch":
        model.reset_classifier(num_classes)
        return model
    if impl == "nnx":
        from flax import nnx

        model.reset_classifier(num_classes, rngs=nnx.Rngs(1))
        return model
    key = jax.random.key(1)
    if impl == "linen":
        module, variables = model
        return module.reset_classifier(variables, num_classes, key=key)
    net, state = model if isinstance(model, tuple) else (model, None)
    net = net.reset_classifier(num_classes, key=key)
    return net if state is None else (net, state)


@pytest.mark.parametrize(("case", "config", "impl"), cover(
    CASES[:len(ARCHS)], torch_marked(zoo.IMPLS), ids=list(ARCHS), per_case=2))
def test_reset_classifier(case, config, impl):
    """A new classifier for 3 classes: the features are kept, the logits have 3 classes, the
    config says so (the model converts as a 3-class model); Equinox and Linen leave the
    original model as it was."""
    x = np.asarray(zoo.example_input(config, batch=2, seed=1))
    model = zoo.create(config, impl, seed=0)
    before = _outputs(model, impl, x)
    new = _reset(model, impl, 3)
    after = _outputs(new, impl, x)
    np.testing.assert_array_equal(after["features"], before["features"])
    np.testing.assert_array_equal(after["pre_logits"], before["pre_logits"])
    assert after["logits"].shape == after["forward"].shape == (2, 3)
    assert_close(after["logits"], after["forward"])
    state = converters.to_canonical(new, impl)
    assert converters.config_of(new, impl).num_classes == 3
    converters.validate(state, zoo.make_config(config.arch, **{**config.TINY, "num_classes": 3}))
    if impl in ("eqx", "linen"):
        np.testing.assert_array_equal(_outputs(model, impl, x)["logits"], before["logits"])
