"""Swin Transformer v1 against timm's `SwinTransformer`: timm's state_dict converts with no
mapping into every library and gives timm's outputs (shifted windows, the shift mask, windows
padded at a non-default size, per-axis window rules, odd sides before patch merging); the
derived buffers (`relative_position_index`, `attn_mask`) are no part of the canonical state
and equal timm's; a checkpoint for another window or image size is adapted as timm's
pretrained loading does (`resize_rel_pos_bias_table`); the feature taps are timm's; drop path
draws alike from one key. The named models are pinned in tests/test_named_models.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import converters
import zoo
from tests import compiled
from zoo.layers.drop_path import block_keys, sample_keep
from zoo.models.intermediates import permutation
from zoo.runtime import fast
from zoo.testing import assert_close
from zoo.weights.adaptation import resize_rel_pos_bias_table

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm", reason="timm is not installed")

# timm's table resizing indexes in ways PyTorch warns about (its own code, not the zoo's)
pytestmark = [pytest.mark.filterwarnings("ignore:torch.searchsorted"),
              pytest.mark.filterwarnings("ignore:Using a non-tuple sequence")]

TOL = 1e-5  # relative: max |zoo - timm| / max |timm|
# timm's keyword names (the zoo's config fields are the same but image_size).
CASES = {
    # 12x8 then 6x4 tokens, window 4: shifted windows, a stage padded to 8 rows and shifted
    # along them only (its 4 columns are one window: not shifted)
    "tiny": {"img_size": (24, 16), "patch_size": 2, "embed_dim": 8, "depths": (2, 2),
             "num_heads": (1, 2), "window_size": 4, "mlp_ratio": 2.0, "num_classes": 5},
    # odd sides (14x10, then 7x5, 4x3) padded before each patch merging; window 3
    "odd": {"img_size": (28, 20), "patch_size": 2, "embed_dim": 8, "depths": (2, 2, 2),
            "num_heads": (1, 2, 2), "window_size": 3, "mlp_ratio": 2.0, "num_classes": 5},
    # swin_tiny's window 7 at 160x160 (not its 224): 40, 20, 10 and 5 tokens a side, the
    # third stage padded to 14 and shifted by 3, the last one window 5, unshifted; no head
    "window7_160": {"img_size": 160, "patch_size": 4, "embed_dim": 16, "depths": (2, 2, 2, 2),
                    "num_heads": (1, 2, 2, 4), "window_size": 7, "num_classes": 0},
}


def _zoo_config(kwargs: dict) -> zoo.Config:
    kw = dict(kwargs)
    size = kw.pop("img_size")
    return zoo.make_config("swin", image_size=size if isinstance(size, tuple) else (size, size),
                           **kw)


@functools.cache
def _timm(case: str):
    """timm's Swin for `case`, every parameter perturbed, eval mode; the zoo config; an input."""
    from timm.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    model = SwinTransformer(**CASES[case]).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    config = _zoo_config(CASES[case])
    x = np.random.default_rng(1).standard_normal((2, *config.input_shape)).astype(np.float32)
    return model, config, x


def _run(impl: str, model, x: np.ndarray) -> np.ndarray:
    api = zoo.native_interface(impl)
    return np.asarray(api.to_canonical(api.forward(model, api.to_native(x))))


@pytest.mark.parametrize("case", sorted(CASES))
def test_timms_swin_converts_with_no_mapping_and_gives_its_outputs(case):
    reference, config, x = _timm(case)
    with torch.no_grad():
        want = reference(torch.from_numpy(x)).numpy()
    assert want.shape == (2, *config.output_shape)
    for impl in zoo.IMPLS:
        got = _run(impl, converters.from_canonical(reference.state_dict(), config, impl), x)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < TOL, f"{case} {impl}: relative error {err:.2e}"


def test_derived_buffers_are_not_canonical_and_equal_timms():
    """timm registers `relative_position_index` and `attn_mask` as non-persistent buffers:
    its state_dict (and the canonical state) holds neither; the zoo's PyTorch model derives the
    same values from the config, and the JAX models derive them when traced."""
    reference, config, _ = _timm("tiny")
    model = zoo.create(config, "torch")
    assert list(model.state_dict()) == list(reference.state_dict())
    assert not [k for k in converters.canonical_spec(config) if "index" in k or "mask" in k]
    theirs = dict(reference.named_buffers())
    ours = dict(model.named_buffers())
    assert set(ours) == {k for k, v in theirs.items() if v is not None}
    for name, value in ours.items():
        np.testing.assert_array_equal(value.numpy(), theirs[name].numpy(), err_msg=name)
    assert any(k.endswith("attn_mask") for k in ours), "no shifted block was built"


@pytest.mark.parametrize(("src", "dst"), [((7, 7), (12, 12)), ((12, 12), (7, 7)),
                                          ((7, 7), (5, 5)), ((4, 4), (3, 5))])
def test_relative_position_bias_tables_resize_as_timms(src, dst):
    from timm.layers import resize_rel_pos_bias_table as timms

    table = np.random.default_rng(0).standard_normal(
        ((2 * src[0] - 1) * (2 * src[1] - 1), 3)).astype(np.float32)
    shape = ((2 * dst[0] - 1) * (2 * dst[1] - 1), 3)
    want = timms(torch.from_numpy(table), new_window_size=dst, new_bias_shape=shape).numpy()
    assert_close(resize_rel_pos_bias_table(table, dst), want)


NAME = "swin_tiny_patch4_window7_224"
SMALL = {"embed_dim": 16, "depths": (2, 2, 2, 2), "num_heads": (1, 2, 2, 4)}


def test_another_window_and_image_size_are_adapted_as_timm(tmp_path):
    """A checkpoint for window 7 at 224x224 loaded for window 8 at 256x256 and 10 classes:
    every relative position bias table resized as timm's pretrained loading does (the head
    re-initialised), the change reported, and timm's outputs with timm's head."""
    torch.manual_seed(0)
    source = timm.create_model(NAME, **SMALL)
    path = tmp_path / "swin.pt"
    torch.save(source.state_dict(), path)
    new = {"img_size": 256, "window_size": 8, "num_classes": 10}
    target = timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay={"file": str(path)},
                               **SMALL, **new).eval()
    with pytest.warns(UserWarning) as said:
        model = zoo.create(NAME, "nnx", weights=str(path), image_size=(256, 256),
                           window_size=8, num_classes=10, **SMALL)
    text = " ".join(str(w.message) for w in said)
    assert "resized the relative_position_bias_tables from 169 to 225 positions" in text
    got = converters.to_canonical(model, "nnx")
    want = {k: v.numpy() for k, v in target.state_dict().items()}
    assert list(got) == list(want)
    for k in want:
        if not k.startswith("head."):
            assert_close(np.asarray(got[k]), want[k], err_msg=k)
    config = model.config
    x = np.random.default_rng(2).standard_normal((1, *config.input_shape)).astype(np.float32)
    with torch.no_grad():
        y = target(torch.from_numpy(x)).numpy()
    ours = converters.from_canonical({**{k: np.asarray(v) for k, v in got.items()},
                                      **{k: v for k, v in want.items() if k.startswith("head.")}},
                                     config, "eqx")
    out = _run("eqx", ours, x)
    assert np.abs(out - y).max() / np.abs(y).max() < TOL


CALLS = ({}, {"indices": 2, "output_fmt": "NCHW"},
         {"indices": [-2, 0], "stop_early": True, "output_fmt": "NHWC"},
         {"indices": (2,), "norm": True, "intermediates_only": True}, {"norm": True})


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_intermediates_are_timms(impl):
    """Each stage's map (the last with the final norm on request), `indices`, `stop_early`
    and `intermediates_only` as timm's, in both layouts (timm's NCHW; channels-last by
    default in Linen and NNX); `forward_features` is timm's channels-last map."""
    reference, config, x = _timm("odd")
    model = converters.from_canonical(reference.state_dict(), config, impl)
    api = zoo.native_interface(impl)
    default = "NHWC" if api.channels_last else "NCHW"
    for kwargs in CALLS:
        fmt = kwargs.get("output_fmt", default)
        with torch.no_grad():
            want = reference.forward_intermediates(
                torch.from_numpy(x), **{k: v for k, v in kwargs.items() if k != "output_fmt"})
        want = jax.tree.map(lambda t: t.numpy(), want)
        got = compiled.call(model, impl, "forward_intermediates", api.to_native(x), **kwargs)
        if kwargs.get("intermediates_only"):
            got, want = (None, got), (None, want)
        final, taps = got
        taps = [np.transpose(np.asarray(t), permutation(fmt, "NCHW")) for t in taps]
        assert len(taps) == len(want[1]), kwargs
        for g, w in zip(taps, want[1], strict=True):
            assert_close(g, w, err_msg=f"{impl} {kwargs}")
        if final is not None:  # timm's final map is channels-last in every library
            assert_close(np.asarray(final), want[0])
    with torch.no_grad():
        features = reference.forward_features(torch.from_numpy(x)).numpy()
    assert_close(np.asarray(compiled.call(model, impl, "forward_features", api.to_native(x))),
                 features)


def test_drop_path_draws_alike_from_one_key():
    """In training, Equinox (per sample, through its interface), Linen and NNX given one key
    drop the same samples of the same blocks (the model's b-th block folds in 2b and 2b + 1),
    and PyTorch given those masks agrees."""
    config = zoo.tiny_config("swin", drop_path_rate=0.5)
    state = zoo.canonical_init(config, seed=0)
    x = np.array(zoo.example_input(config, batch=6, seed=1))
    key = jax.random.key(3)
    outs = {}
    for impl in ("eqx", "nnx"):
        api = zoo.interface(impl)
        model = converters.from_canonical(state, config, impl)
        y, _ = fast.forward(model, impl, train=True)(api.to_native(x), key)
        outs[impl] = np.asarray(y)
    module, variables = converters.from_canonical(state, config, "linen")
    outs["linen"] = np.asarray(jax.jit(functools.partial(module.apply, train=True))(
        variables, jnp.asarray(x).transpose(0, 2, 3, 1), key=key))
    model = converters.from_canonical(state, config, "torch").train()
    samples = jax.random.split(key, 6)
    blocks = [b for stage in model.layers for b in stage.blocks]
    rates = [r for stage in config.drop_path_rates() for r in stage]
    for b, (block, rate) in enumerate(zip(blocks, rates, strict=True)):
        for j, layer in enumerate((block.drop_path1, block.drop_path2)):
            keep = jax.vmap(lambda k, r=rate: sample_keep(k, r))(block_keys(samples, 2 * b + j))
            layer.keep = torch.from_numpy(np.array(keep))
    with torch.no_grad():
        outs["torch"] = model(torch.from_numpy(x)).numpy()
        eval_out = model.eval()(torch.from_numpy(x)).numpy()
    assert np.abs(outs["torch"] - eval_out).max() > 1e-3, "no block was dropped"
    for impl, y in outs.items():
        assert_close(y, outs["eqx"], err_msg=impl)
