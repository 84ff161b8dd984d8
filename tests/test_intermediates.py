"""timm's `forward_intermediates`, the same name and semantics in every library: the stem and stage
taps of a ResNet, the stage taps of a ConvNeXt, timm's stage ends of EfficientNet and
MobileNetV3, the per-block feature maps of a ViT (prefix
tokens left out or returned beside them), `indices`, `norm`, `stop_early`, `intermediates_only`
and the layouts (`output_fmt`, channels-last by default in Linen and NNX), each against timm's
own models on the same weights."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import converters
import zoo
from tests import compiled
from tests.conftest import HAVE_TORCH, torch_marked
from tests.kind_cover import cover
from tests.timm_mbconv import timm_model
from zoo.models.intermediates import permutation
from zoo.testing import assert_close

METHOD = "forward_intermediates"
VIT = {"patch_size": 8, "depth": 3, "num_heads": 3, "mlp_ratio": 2.0, "num_classes": 7}
CONVNEXT = {"depths": (1, 1, 1, 1), "dims": (8, 16, 24, 32)}
REGISTERS = {"class_token": False, "reg_tokens": 2, "global_pool": "avg", "fc_norm": False}


def _timm_vit(timm, **options):
    return timm.models.vision_transformer.VisionTransformer(
        img_size=(32, 48), embed_dim=48, **VIT, **options)


# timm's options, in the library's default layout and in both named ones; the ViT's also
# with its prefix tokens, the final norm and its tokens as they are.
CALLS = ({}, {"indices": 2, "output_fmt": "NCHW"},
         {"indices": [-2, 0], "stop_early": True, "output_fmt": "NHWC"},
         {"indices": (1,), "intermediates_only": True})
VIT_CALLS = ({"norm": True, "return_prefix_tokens": True},
             {"indices": 1, "norm": True, "return_prefix_tokens": True,
              "intermediates_only": True}, {"output_fmt": "NLC"})
# timm's models (built from the timm module), the zoo's configs of the same shapes and the
# calls to compare; non-square inputs, so that a map with its height and width swapped fails.
# EfficientNet: taps where the next stage strides and at the end (1, 3, 4 here), the head conv
# only after the last stage; MobileNetV3: the stem tapped (its first block strides), and
# `stop_early` only with `intermediates_only` (as timm's).
EFFICIENTNET = zoo.tiny_config("efficientnet", input_size=(32, 48), arch_def=(
    ("ds_r1_k3_s1_e1_c8_se0.25",), ("ir_r2_k3_s2_e2_c8_se0.25",), ("ir_r1_k5_s1_e2_c16_se0.25",),
    ("ir_r1_k3_s2_e2_c16",)))
MOBILENETV3 = zoo.tiny_config("mobilenetv3", input_size=(32, 48))
MB_CALLS = (*CALLS[:2], {**CALLS[2], "intermediates_only": True}, CALLS[3])
REFERENCES = {
    "resnet18": (lambda timm: timm.create_model("resnet18"),
                 zoo.make_config("resnet18", input_size=(32, 48)), CALLS),
    "vit": (_timm_vit, zoo.make_config("vit", image_size=(32, 48), width=48, **VIT),
            CALLS + VIT_CALLS),
    "convnext": (lambda timm: timm.create_model("convnext_atto", **CONVNEXT),
                 zoo.make_config("convnext_atto", **CONVNEXT, input_size=(32, 48)), CALLS),
    "vit-registers": (functools.partial(_timm_vit, **REGISTERS),
                      zoo.make_config("vit", image_size=(32, 48), width=48, **VIT,
                                      **REGISTERS), CALLS + VIT_CALLS),
    "efficientnet": (lambda timm: timm_model(EFFICIENTNET), EFFICIENTNET, CALLS),
    "mobilenetv3": (lambda timm: timm_model(MOBILENETV3), MOBILENETV3, MB_CALLS),
}


@functools.cache
def _timm(name: str):
    """timm's model for `REFERENCES[name]` in eval mode, randomised around its initial values
    (timm starts biases, tokens and BatchNorm at constants); an input."""
    torch = pytest.importorskip("torch")
    timm = pytest.importorskip("timm", reason="timm is not installed")
    build, cfg, _ = REFERENCES[name]
    torch.manual_seed(0)
    model = build(timm).eval()
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.add_(0.02 * torch.randn_like(t))
    return model, np.asarray(zoo.example_input(cfg, batch=2, seed=3))


def _timm_call(model, x: np.ndarray, kwargs: dict, fmt: str):
    import torch

    with torch.no_grad():
        out = model.forward_intermediates(torch.from_numpy(x.copy()), **kwargs,
                                          output_fmt="NLC" if fmt == "NLC" else "NCHW")
    return jax.tree.map(lambda t: t.numpy(), out)


def _as_timms(out, impl: str, fmt: str, only: bool):
    """A zoo result in timm's layouts: maps channels-first (tokens for "NLC"), the final
    features as the library's `to_canonical` gives them."""
    api = zoo.native_interface(impl)

    def tap(t):
        if isinstance(t, tuple):  # (map, prefix tokens)
            return tap(t[0]), np.asarray(t[1])
        return np.asarray(t) if fmt == "NLC" else np.transpose(t, permutation(fmt, "NCHW"))

    if only:
        return [tap(t) for t in out]
    final, taps = out
    return np.asarray(api.to_canonical(final) if np.ndim(final) == 4 else final), [
        tap(t) for t in taps]


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize(("name", "impl"), cover(sorted(REFERENCES), zoo.IMPLS))
def test_intermediates_are_timms(name, impl):
    """Each call gives timm's tensors (structure, shapes and values) from the zoo model
    converted from timm's state_dict; without `output_fmt`, in the library's own layout."""
    timm_model, x = _timm(name)
    _, cfg, calls = REFERENCES[name]
    model = converters.from_canonical(timm_model.state_dict(), cfg, impl)
    api = zoo.native_interface(impl)
    default = "NHWC" if api.channels_last else "NCHW"  # the library's natural layout
    for kwargs in calls:
        fmt = kwargs.get("output_fmt", default)
        only = kwargs.get("intermediates_only", False)
        got = _as_timms(compiled.call(model, impl, METHOD, api.to_native(x), **kwargs), impl,
                        fmt, only)
        want = _timm_call(timm_model, x, {k: v for k, v in kwargs.items() if k != "output_fmt"},
                          fmt)
        label = f"{name} {impl} {kwargs}"
        assert jax.tree.structure(got) == jax.tree.structure(want), label
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert g.shape == w.shape, label
            assert_close(g, w, err_msg=label)


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_timms_resnet50_converts_with_no_mapping():
    """timm's ResNet-50 (Bottlenecks) has the zoo's (torchvision's) state_dict keys and
    shapes, as ResNet-18 above: its taps are the same modules' outputs. Built on the meta
    device: no weights."""
    torch = pytest.importorskip("torch")
    timm = pytest.importorskip("timm", reason="timm is not installed")
    from zoo.models.resnet.torch import ResNet

    with torch.device("meta"):
        theirs = timm.create_model("resnet50").state_dict()
        ours = ResNet(zoo.make_config("resnet50")).state_dict()
    assert {k: v.shape for k, v in theirs.items()} == {k: v.shape for k, v in ours.items()}


TINY = [(f"{arch}-{name}" if name else arch, zoo.tiny_config(arch, **over))
        for arch in ("resnet", "vit", "convnext", "efficientnet", "mobilenetv3")
        for name, over in {None: {}, **zoo.architecture(arch).config.VARIANTS}.items()]


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize(("case", "config", "impl"), cover(
    TINY, zoo.JAX_IMPLS, ids=[c for c, _ in TINY]))
def test_intermediates_agree_with_torch(case, config, impl):
    """The tiny configs and their variants (one to four stages, the CIFAR and ImageNet stems,
    Bottlenecks; prefix tokens or none): every tap in both map layouts, as the reference's."""
    x = np.asarray(zoo.example_input(config, batch=2, seed=1))
    torch_model = zoo.create(config, "torch", seed=0)
    model = zoo.create(config, impl, seed=0)
    api, ref = zoo.native_interface(impl), zoo.native_interface("torch")
    for fmt in ("NCHW", "NHWC"):
        want = ref.call(torch_model, METHOD, x, output_fmt=fmt)
        got = compiled.call(model, impl, METHOD, api.to_native(x), output_fmt=fmt)
        got, want = _as_timms(got, impl, fmt, False), _as_timms(want, "torch", fmt, False)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert_close(g, w, err_msg=f"{case} {impl} {fmt}")


@pytest.mark.parametrize("impl", torch_marked(zoo.IMPLS))
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"indices": 4}, r"indices=4 asks for the last 4 of 3 taps; use 1 to 3"),
    ({"indices": [0, 3]}, r"index 3 is out of range; 3 taps take -3 to 2"),
    ({"indices": [-4]}, r"index -4 is out of range; 3 taps take -3 to 2"),
    ({"indices": [1.5]}, r"indices takes ints, found 1.5"),
    ({"output_fmt": "NLC"}, r"output_fmt 'NLC' is not one of NCHW, NHWC"),
])
def test_bad_arguments_are_one_line(impl, kwargs, message):
    """A bad index or layout is refused in one line naming it and what is valid (a tiny
    ResNet has 3 taps: the stem and two stages)."""
    config = zoo.tiny_config("resnet")
    model = zoo.create(config, impl, seed=0)
    api = zoo.native_interface(impl)
    x = api.to_native(np.asarray(zoo.example_input(config, batch=1)))
    with pytest.raises(ValueError, match=message) as err:
        api.call(model, METHOD, x, **kwargs)
    assert "\n" not in str(err.value)
