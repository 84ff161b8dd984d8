"""Loading with adaptation (timm's pretrained path): another num_classes, image size or number
of input channels, through `zoo.create(..., weights=...)` and `python -m converters convert`,
each adaptation checked against timm's own functions and timm's own loading."""

from __future__ import annotations

import json

import numpy as np
import pytest

import converters
import zoo
from converters.__main__ import main
from zoo.testing import assert_close
from zoo.weights.adaptation import adapt_input_conv, resample_pos_embed

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm", reason="timm is not installed")

NAME = "vit_tiny_patch16_224"
SMALL = {"depth": 1}  # one block of vit_tiny: small enough for every library
NEW = {"num_classes": 10, "image_size": (64, 64), "in_channels": 1}


@pytest.mark.parametrize(("old", "new", "prefix"), [
    ((2, 2), (4, 4), 1), ((4, 4), (2, 2), 0), ((4, 4), (6, 3), 3), ((7, 7), (12, 12), 5)])
def test_resample_pos_embed_is_timms(old, new, prefix):
    """Bicubic with antialiasing, prefix tokens kept aside, up and down, to a non-square grid:
    timm's `resample_abs_pos_embed` to float32 rounding."""
    from timm.layers import resample_abs_pos_embed

    pe = np.random.default_rng(0).standard_normal((1, prefix + old[0] * old[1], 8), np.float32)
    want = resample_abs_pos_embed(torch.from_numpy(pe), new_size=list(new),
                                  num_prefix_tokens=prefix).numpy()
    got = resample_pos_embed(pe, new, prefix)
    assert got.shape == want.shape
    assert_close(got, want)


@pytest.mark.parametrize(("cin", "new", "out"), [
    (3, 1, 1), (3, 2, 2), (3, 5, 5), (3, 7, 7), (6, 1, 2), (1, 1, 1)])
def test_adapt_input_conv_is_timms(cin, new, out):
    """One channel sums the RGB filters (per group of 3: a space-to-depth stem keeps its
    groups), more repeat them scaled by 3 / channels: timm's `adapt_input_conv`."""
    from timm.models import adapt_input_conv as timms

    w = np.random.default_rng(1).standard_normal((4, cin, 3, 3), np.float32)
    want = timms(new, torch.from_numpy(w.copy())).numpy()
    got = adapt_input_conv(new, w)
    assert got.shape == want.shape == (4, out, 3, 3)
    assert_close(got, want)


def test_other_channel_counts_are_refused_in_one_line():
    with pytest.raises(zoo.ConfigError, match="4 input channels to 2"):
        adapt_input_conv(2, np.zeros((4, 4, 3, 3), np.float32))


def _timm_pair(tmp: str) -> tuple[str, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """(checkpoint path, adapted timm state_dict, input, timm's logits): a random timm
    vit_tiny (one block, 32x32 images, 1000 classes) saved with torch.save, then loaded by
    timm's pretrained path into 10 classes, 64x64 images and one input channel."""
    torch.manual_seed(0)
    source = timm.create_model(NAME, img_size=32, **SMALL)
    with torch.no_grad():  # timm starts biases and tokens at constants: perturb every one
        for p in source.parameters():
            p.add_(0.02 * torch.randn_like(p))
    path = f"{tmp}/vit.pt"
    torch.save(source.state_dict(), path)
    target = timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay={"file": path},
                               num_classes=10, img_size=64, in_chans=1, **SMALL).eval()
    x = np.asarray(zoo.example_input(zoo.make_config(NAME, **SMALL, **NEW), batch=2, seed=1))
    with torch.no_grad():
        y = target(torch.from_numpy(x.copy())).numpy()
    state = {k: v.numpy() for k, v in target.state_dict().items()}
    return path, state, x, y


@pytest.fixture(scope="module")
def timm_pair(tmp_path_factory):
    return _timm_pair(str(tmp_path_factory.mktemp("adapt")))


def _with_head(state: dict[str, np.ndarray], head: dict[str, np.ndarray], impl: str) -> object:
    """A model of `impl` holding `state` with the classifier arrays of `head` (timm draws its
    new classifier from torch's generator, the zoo from its seed)."""
    cfg = zoo.make_config(NAME, **SMALL, **NEW)
    return converters.from_canonical({**state, **head}, cfg, impl)


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_create_with_weights_adapts_as_timm(impl, timm_pair):
    """zoo.create(name, impl, weights=PATH, num_classes=10, image_size=(64, 64),
    in_channels=1): every array but the new classifier is timm's adapted one, the change is
    reported, and with timm's classifier the outputs are timm's."""
    path, want, x, y = timm_pair
    with pytest.warns(UserWarning) as said:
        model = zoo.create(NAME, impl, weights=path, **SMALL, **NEW)
    text = " ".join(str(w.message) for w in said)
    for part in ("re-initialised head for 10 classes (the checkpoint has 1000)",
                 "resampled pos_embed from 4 to 4x4", "from 3 to 1 input channels"):
        assert part in text
    got = converters.to_canonical(model, impl)
    assert list(got) == list(want)
    for k in want:
        if not k.startswith("head."):
            assert_close(np.asarray(got[k]), want[k], err_msg=k)
    fresh = zoo.canonical_init(zoo.make_config(NAME, **SMALL, **NEW))
    np.testing.assert_array_equal(np.asarray(got["head.weight"]), fresh["head.weight"])
    head = {k: v for k, v in want.items() if k.startswith("head.")}
    out = zoo.native_interface(impl).forward(
        _with_head({k: np.asarray(v) for k, v in got.items()}, head, impl),
        zoo.native_interface(impl).to_native(x.copy()))
    assert_close(zoo.native_interface(impl).to_canonical(np.asarray(out)), y)


def test_weights_that_fit_are_loaded_as_they_are(timm_pair, recwarn):
    path, *_ = timm_pair
    model = zoo.create(NAME, "nnx", weights=path, image_size=(32, 32), **SMALL)
    state = torch.load(path, weights_only=True)
    got = converters.to_canonical(model, "nnx")
    for k, v in state.items():
        np.testing.assert_array_equal(np.asarray(got[k]), v.numpy(), err_msg=k)
    assert not [w for w in recwarn if "weights:" in str(w.message)]


def test_weights_of_another_model_are_refused_in_one_line(timm_pair):
    path, *_ = timm_pair
    with pytest.raises(zoo.ConfigError, match=r"'blocks\.0\.mlp\.fc1\.weight' is \(768, 192\), "
                                              r"expected \(16, 192\)"):
        zoo.create(NAME, "eqx", weights=path, mlp_ratio=16 / 192, **SMALL)


def test_state_dict_weights_are_not_changed():
    cfg = zoo.tiny_config("resnet")
    state = zoo.canonical_init(cfg, seed=3)
    before = {k: v.copy() for k, v in state.items()}
    with pytest.warns(UserWarning, match="conv1.weight from 3 to 2 input channels"):
        model = zoo.create("resnet", "nnx", weights=state, **{**cfg.TINY, "in_channels": 2})
    for k, v in before.items():
        np.testing.assert_array_equal(state[k], v)
    got = converters.to_canonical(model, "nnx")
    np.testing.assert_allclose(np.asarray(got["conv1.weight"]),
                               adapt_input_conv(2, before["conv1.weight"]))


def test_resnet_adapts_as_timm(tmp_path):
    """A torchvision-layout ResNet (timm's resnet18 has torchvision's keys) into 10 classes
    and one input channel: timm's pretrained loading gives the same arrays."""
    torch.manual_seed(0)
    source = timm.create_model("resnet18")
    path = tmp_path / "resnet18.pt"
    torch.save(source.state_dict(), path)
    target = timm.create_model("resnet18", pretrained=True, num_classes=10, in_chans=1,
                               pretrained_cfg_overlay={"file": str(path)})
    with pytest.warns(UserWarning) as said:
        state = zoo.load_weights(str(path), zoo.make_config("resnet18", num_classes=10,
                                                              in_channels=1))
    assert [str(w.message) for w in said] == [
        "resnet weights: re-initialised fc for 10 classes (the checkpoint has 1000)",
        "resnet weights: adapted conv1.weight from 3 to 1 input channels"]
    for k, v in target.state_dict().items():
        if not k.startswith("fc."):
            assert_close(state[k], v.numpy(), err_msg=k)
        assert state[k].shape == tuple(v.shape)


@pytest.mark.parametrize("impl", zoo.JAX_IMPLS)
def test_cli_adapts_as_create(impl, timm_pair, tmp_path, capsys):
    """python -m converters convert SRC DST --to IMPL --arch NAME --num-classes 10
    --image-size 64 --in-channels 1: the same arrays as zoo.create, the changes printed."""
    path, *_ = timm_pair
    dst = tmp_path / f"vit_{impl}"
    rc = main(["convert", path, str(dst), "--to", impl, "--arch", NAME, "--config",
               json.dumps(SMALL), "--num-classes", "10", "--image-size", "64",
               "--in-channels", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "adapted: re-initialised head for 10 classes" in out
    assert "adapted: resampled pos_embed" in out
    with pytest.warns(UserWarning):
        want = converters.to_canonical(zoo.create(NAME, impl, weights=path, **SMALL, **NEW),
                                       impl)
    got = converters.load(dst, "canonical")
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=k)


def test_cli_adapt_option_of_no_field_is_refused(timm_pair, tmp_path, capsys):
    path, *_ = timm_pair
    rc = main(["convert", path, str(tmp_path / "r"), "--to", "nnx", "--arch", "resnet18",
               "--image-size", "32"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "unknown resnet config keys ['image_size']" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("name", "head"), [("efficientnet_b0", "classifier"),
                                            ("mobilenetv3_small_100", "classifier")])
def test_efficientnet_and_mobilenetv3_adapt_as_timm(name, head, tmp_path):
    """timm's EfficientNet / MobileNetV3 checkpoint into 10 classes and one input channel:
    timm's pretrained loading gives the same arrays (a new classifier, conv_stem adapted)."""
    torch.manual_seed(0)
    source = timm.create_model(name)
    path = tmp_path / f"{name}.pt"
    torch.save(source.state_dict(), path)
    target = timm.create_model(name, pretrained=True, num_classes=10, in_chans=1,
                               pretrained_cfg_overlay={"file": str(path)})
    config = zoo.make_config(name, num_classes=10, in_channels=1)
    with pytest.warns(UserWarning) as said:
        state = zoo.load_weights(str(path), config)
    arch = config.arch
    assert [str(w.message) for w in said] == [
        f"{arch} weights: re-initialised {head} for 10 classes (the checkpoint has 1000)",
        f"{arch} weights: adapted conv_stem.weight from 3 to 1 input channels"]
    for k, v in target.state_dict().items():
        if not k.startswith(f"{head}."):
            assert_close(state[k], v.numpy(), err_msg=k)
        assert state[k].shape == tuple(v.shape)
