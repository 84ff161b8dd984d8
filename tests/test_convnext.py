"""ConvNeXt (v1, v2): timm's names, shapes and parameter counts for every named model, and timm's
function in every library, in evaluation and in training (drop path on, the masks matched), with
timm's gradients.

`tests/fixtures/named_timm_convnext.json` holds every name's state_dict keys, shapes and
parameter count as timm builds them (on PyTorch's meta device: no weights); regenerate it with
`python -m tests.test_convnext`. Two reduced-depth models taking every path of a block (the MLP
as Linear layers or 1x1 convolutions, GRN, layer scale) with every array perturbed, and one
full-depth model (convnext_atto), are compared with timm's own models on the same weights. In
training, timm's `DropPath` draws from PyTorch's generator: each JAX library's masks (computed
from the key it was given, `zoo.layers.drop_path`) are handed to timm's blocks through the zoo's
PyTorch `DropPath`, which computes timm's `drop_path` given a mask (`test_drop_path.py` pins it,
and the zoo's PyTorch model equals timm's under the same seed here)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import converters
import zoo
from tests.kind_cover import cover
from tests.test_named_models import _dump, _trainable, reference_entry
from zoo.layers.drop_path import block_keys, keep_mask
from zoo.models.convnext.config import ConvNeXtConfig, linspace_f32
from zoo.registry import schema
from zoo.testing import assert_close

FIXTURE = Path(__file__).parent / "fixtures" / "named_timm_convnext.json"
NAMES = tuple(ConvNeXtConfig.NAMED)
RTOL = 1e-5  # max |a - b| / max |a|
KEY = jax.random.key(22)  # masks that drop some samples of every block, none all of them


@functools.cache
def pinned() -> dict[str, dict]:
    return json.loads(FIXTURE.read_text())["models"]


def write_fixture() -> None:
    import timm

    models = {n: reference_entry("timm", n) for n in NAMES}
    FIXTURE.write_text(_dump(f"timm {timm.__version__} create_model(pretrained=False, "
                             "num_classes=1000) on the meta device: trainable parameter count "
                             "and state_dict key -> shape; written by `python -m "
                             "tests.test_convnext`", models))


# --------------------------------------------------------------------------- names and shapes
def test_every_name_is_pinned():
    assert set(pinned()) == set(NAMES) == set(zoo.list_models("convnext_*")) | set(
        zoo.list_models("convnextv2_*"))


@pytest.mark.parametrize("name", NAMES)
def test_named_config_has_timms_keys_shapes_and_parameter_count(name):
    """From the abstract skeleton (no weights): the keys in timm's order, their shapes and
    the trainable parameter count."""
    layers, spec = schema(zoo.make_config(name))
    want = pinned()[name]
    assert list(spec) == list(want["state_dict"])
    assert {k: list(v.shape) for k, v in spec.items()} == want["state_dict"]
    assert _trainable(spec, layers) == want["params"]


def test_fixture_is_timms():
    pytest.importorskip("torch")
    pytest.importorskip("timm")
    assert pinned() == {n: reference_entry("timm", n) for n in NAMES}


# --------------------------------------------------------------------------- configs
@pytest.mark.parametrize(("overrides", "match"), [
    ({"depths": (1, 1), "dims": (4,)}, "one per stage"),
    ({"depths": (1,) * 5, "dims": (4,) * 5}, "1 to 4 entries"),
    ({"depths": (0, 1)}, "positive"),
    ({"kernel_size": 4}, "must be odd"),
    ({"mlp_ratio": 0.1}, "positive hidden width"),
    ({"drop_path_rate": 1.0}, r"drop_path_rate must be in \[0, 1\)"),
    ({"ls_init_value": True}, "ls_init_value must be a number or null"),
    ({"norm_eps": 0.0}, "norm_eps must be positive"),
])
def test_bad_configs_are_refused_in_one_line(overrides, match):
    with pytest.raises(zoo.ConfigError, match=match) as info:
        zoo.tiny_config("convnext", **overrides)
    assert "\n" not in str(info.value)


def test_drop_path_rates_are_timms():
    """torch.linspace(0, rate, blocks) in float32, split per stage, exactly."""
    torch = pytest.importorskip("torch")
    layers = pytest.importorskip("timm.layers")
    for rate in (0.0, 0.1, 0.3, 0.5, 0.123):
        for depths in ((1,), (2, 2, 6, 2), (3, 3, 27, 3), (1, 2, 1, 1)):
            config = zoo.make_config("convnext", depths=depths, dims=(8,) * len(depths),
                                     drop_path_rate=rate)
            want = layers.calculate_drop_path_rates(rate, list(depths), stagewise=True)
            assert [list(r) for r in config.drop_path_rates()] == want, (rate, depths)
    assert list(linspace_f32(0.5, 60)) == torch.linspace(0, 0.5, 60).tolist()


# --------------------------------------------------------------------------- timm's function
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm", reason="timm is not installed")
from zoo.layers.torch import DropPath  # noqa: E402  (needs torch)

REDUCED = {"depths": (1, 1, 1, 1), "dims": (8, 16, 24, 32), "num_classes": 7,
           "drop_path_rate": 0.4}
# Every path of a block in two models (timm builds GRN and layer scale together too): the MLP
# as Linear layers on a channels-last map (GRN over its last axis) and as 1x1 convolutions on a
# channels-first one (LayerNorm2d, GRN over axis 1); the named configs' structures (v2's blocks
# have no layer scale) are pinned by their keys above.
CASES = {"linear-mlp": "convnext_tiny", "conv-mlp": "convnext_atto"}
SIZE = (32, 40)
BATCH = 4


class _Probe(nn.Module):
    @nn.compact
    def __call__(self) -> jax.Array:
        return self.make_rng("dropout")


def model_key(impl: str, key: jax.Array) -> jax.Array:
    """The key a model of `impl` draws its drop path masks from, given `key` by
    `zoo.interface(impl).apply`: the key itself, or Linen's first `make_rng("dropout")` of the
    top module (its path and call count folded in: the same for any module at the root)."""
    return _Probe().apply({}, rngs={"dropout": key}) if impl == "linen" else key


def drop_masks(config: ConvNeXtConfig, key: jax.Array, batch: int) -> list[np.ndarray]:
    """Every block's keep mask (in model order) drawn from a model's key: sample `i` of block
    `l` with `fold_in(split(key, batch)[i], l)`."""
    samples = jax.random.split(key, batch)
    rates = [r for stage in config.drop_path_rates() for r in stage]
    return [np.array(keep_mask(block_keys(samples, i), batch, rate))
            for i, rate in enumerate(rates)]


def run_timm(model, x: np.ndarray, masks: list[np.ndarray] | None, cotangent=None):
    """timm's outputs (and gradients of <y, cotangent> by state_dict key); in training with
    `masks`, each drop path applies its mask (timm's `drop_path` given that mask)."""
    blocks = [b for stage in model.stages for b in stage.blocks]
    saved = [b.drop_path for b in blocks]
    try:
        if masks is not None:
            for block, mask in zip(blocks, masks, strict=True):
                if isinstance(block.drop_path, timm.layers.DropPath):
                    block.drop_path = DropPath(block.drop_path.drop_prob)
                    block.drop_path.keep = torch.from_numpy(mask)
        model.train(masks is not None)
        model.zero_grad()
        y = model(torch.from_numpy(x))
        if cotangent is None:
            return y.detach().numpy(), None
        (y * torch.from_numpy(cotangent)).sum().backward()
        return y.detach().numpy(), {k: p.grad.numpy() for k, p in model.named_parameters()}
    finally:
        for block, drop in zip(blocks, saved, strict=True):
            block.drop_path = drop
        model.eval()


@functools.cache
def reference(name: str, overrides: tuple = ()):
    """timm's model `name` with `overrides`, every array perturbed (timm starts biases, GRN and
    layer scale at constants), and the zoo config of the same shapes."""
    kwargs = dict(overrides)
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kwargs).eval()
    with torch.no_grad():
        for v in model.state_dict().values():
            if v.is_floating_point():
                v.add_(0.1 * torch.randn_like(v))
    return model, zoo.make_config(name, **kwargs, input_size=SIZE)


def relative(got, want) -> float:
    """max |got - want| / max |want| (an all-zero `want` must be matched exactly)."""
    err = float(np.abs(np.asarray(got) - want).max())
    if not np.abs(want).any():
        return 0.0 if err == 0 else np.inf
    return err / float(np.abs(want).max())


def jax_run(model, impl: str, x: np.ndarray, train: bool, cotangent=None):
    """Canonical outputs (and canonical gradients of <y, cotangent>) of a JAX model."""
    api = zoo.interface(impl)
    static, params, state = api.split(model)

    def loss(params):
        y, _ = api.apply(static, params, state, api.to_native(jnp.asarray(x)), train=train,
                         key=KEY if train else None)
        y = api.to_canonical(y)
        return jnp.sum(y * (cotangent if cotangent is not None else 0.0)), y

    if cotangent is None:
        return np.asarray(jax.jit(loss)(params)[1]), None
    (_, y), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(y), converters.to_canonical(api.merge(static, g, state), impl)


def torch_run(model, x: np.ndarray, masks, cotangent=None):
    """The zoo's PyTorch model, its drop paths given `masks` in training."""
    drops = [b.drop_path for stage in model.stages for b in stage.blocks]
    for drop, mask in zip(drops, masks or [None] * len(drops), strict=True):
        drop.keep = None if mask is None else torch.from_numpy(mask)
    model.train(masks is not None)
    model.zero_grad()
    y = model(torch.from_numpy(x))
    if cotangent is None:
        return y.detach().numpy(), None
    (y * torch.from_numpy(cotangent)).sum().backward()
    return y.detach().numpy(), {k: p.grad.numpy() for k, p in model.named_parameters()}


@pytest.mark.parametrize(("case", "impl"), cover(list(CASES), zoo.IMPLS, per_case=2))
def test_reduced_depth_computes_timms_outputs_and_gradients(case, impl):
    """timm's state_dict loads into the named config (reduced depth, small widths, GRN and
    layer scale) with no mapping; eval outputs, training outputs with drop path on (masks
    matched) and the gradients of every parameter in training are timm's."""
    model_ref, config = reference(CASES[case], (*REDUCED.items(), ("use_grn", True)))
    assert config.use_grn and config.layer_scale
    x = np.random.default_rng(1).standard_normal((BATCH, 3, *SIZE)).astype(np.float32)
    cotangent = np.random.default_rng(2).standard_normal((BATCH, 7)).astype(np.float32)
    model = converters.from_canonical(model_ref.state_dict(), config, impl)
    masks = drop_masks(config, model_key(impl, KEY), BATCH)
    assert any(not m.all() for m in masks), "no sample dropped: the masks prove nothing"
    want_eval, _ = run_timm(model_ref, x, None)
    want_train, want_grads = run_timm(model_ref, x, masks, cotangent)
    if impl == "torch":
        got_eval, _ = torch_run(model, x, None)
        got_train, grads = torch_run(model, x, masks, cotangent)
    else:
        got_eval, _ = jax_run(model, impl, x, False)
        got_train, grads = jax_run(model, impl, x, True, cotangent)
    assert relative(got_eval, want_eval) < RTOL
    assert relative(got_train, want_train) < RTOL
    assert not np.allclose(want_train, want_eval), "drop path changed nothing"
    assert set(grads) >= set(want_grads)
    dead = [k for k, g in want_grads.items() if not np.abs(g).any()]
    assert not dead, f"zero gradients prove nothing: {dead}"
    worst = max(want_grads, key=lambda k: relative(grads[k], want_grads[k]))
    assert relative(grads[worst], want_grads[worst]) < RTOL, worst


def test_the_zoos_torch_model_draws_timms_masks_under_the_same_seed():
    model_ref, config = reference("convnextv2_tiny", tuple(REDUCED.items()))
    model = converters.from_canonical(model_ref.state_dict(), config, "torch")
    x = torch.randn(BATCH, 3, *SIZE)
    torch.manual_seed(5)
    want = model_ref.train()(x)
    torch.manual_seed(5)
    got = model.train()(x)
    model_ref.eval()
    assert torch.equal(got, want)


# The reduced depths above run every library; the full depth is more of the same blocks:
# one library (--exhaustive: all).
@pytest.mark.parametrize(("name", "impl"), cover(["convnext_atto"], zoo.IMPLS))
def test_convnext_atto_at_full_depth_is_timms(name, impl):
    """The full-depth convnext_atto (timm's 1x1-conv MLP, 12 blocks), eval and training."""
    model_ref, config = reference(name, (("drop_path_rate", 0.2),))
    config = zoo.make_config(name, drop_path_rate=0.2, input_size=(32, 32))
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)
    model = converters.from_canonical(model_ref.state_dict(), config, impl)
    masks = drop_masks(config, model_key(impl, KEY), 2)
    for train in (False, True):
        want, _ = run_timm(model_ref, x, masks if train else None)
        got = (torch_run(model, x, masks if train else None)[0] if impl == "torch"
               else jax_run(model, impl, x, train)[0])
        assert relative(got, want) < RTOL, (impl, train)


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_any_size_timm_takes(impl):
    """A model that pools globally takes any size timm's does: 32x32 and 33x45 give timm's
    logits; 31 rows are refused in one line naming the rule (timm's fails in its last
    downsampling)."""
    model_ref, config = reference(CASES["linear-mlp"], (*REDUCED.items(), ("use_grn", True)))
    model = converters.from_canonical(model_ref.state_dict(), config, impl)
    api = zoo.native_interface(impl)
    for shape in ((2, 3, 32, 32), (2, 3, 33, 45)):
        x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
        want, _ = run_timm(model_ref, x, None)
        got = np.asarray(api.to_canonical(np.asarray(api.forward(model, api.to_native(x)))))
        assert relative(got, want) < RTOL, shape
    x = np.zeros((1, 3, 31, 40), np.float32)
    with pytest.raises(zoo.ConfigError) as info:
        api.forward(model, api.to_native(x))
    assert str(info.value) == ("convnext expects (3, H, W) per sample (H >= 32; W >= 32), got "
                               "(3, 31, 40): H >= 32, not 31")


def test_adapts_as_timm(tmp_path):
    """A timm checkpoint into 10 classes and one input channel: timm's pretrained loading
    gives the same arrays (a new head.fc, the stem's conv adapted)."""
    torch.manual_seed(0)
    source = timm.create_model("convnext_atto")
    path = tmp_path / "convnext_atto.pt"
    torch.save(source.state_dict(), path)
    target = timm.create_model("convnext_atto", pretrained=True, num_classes=10, in_chans=1,
                               pretrained_cfg_overlay={"file": str(path)})
    with pytest.warns(UserWarning) as said:
        state = zoo.load_weights(str(path), zoo.make_config("convnext_atto", num_classes=10,
                                                              in_channels=1))
    assert [str(w.message) for w in said] == [
        "convnext weights: re-initialised head.fc for 10 classes (the checkpoint has 1000)",
        "convnext weights: adapted stem.0.weight from 3 to 1 input channels"]
    for k, v in target.state_dict().items():
        assert state[k].shape == tuple(v.shape), k
        if not k.startswith("head.fc."):
            assert_close(state[k], v.numpy(), err_msg=k)


def test_timm_hub_folder_converts_without_arch(tmp_path, capsys):
    """A timm hub folder of a ConvNeXt V2 (`save_for_hf`, offline): its config.json gives the
    named config with timm's model_args (depths, classes, input size), the weights load with
    no mapping and the zoo's model gives timm's outputs."""
    from timm.models import save_for_hf

    from tests.converter_cli import cli

    model_ref, _ = reference("convnextv2_atto", (("depths", (1, 1, 1, 1)), ("num_classes", 7)))
    folder = tmp_path / "convnextv2-demo"
    folder.mkdir()
    save_for_hf(model_ref, str(folder), safe_serialization=True,
                data_config={"input_size": (3, 64, 64)})
    dst = tmp_path / "out.pt"
    code, out, err = cli(capsys, "convert", folder, dst, "--to", "torch")
    assert "timm hub folder" in out
    assert code == 0, err
    config = converters.load(dst).config
    assert config == zoo.make_config("convnextv2_atto", depths=(1, 1, 1, 1), num_classes=7,
                                     input_size=(64, 64))
    x = np.random.default_rng(7).standard_normal((2, 3, 64, 64)).astype(np.float32)
    got, _ = torch_run(converters.load(dst, "torch"), x, None)
    assert relative(got, run_timm(model_ref, x, None)[0]) < RTOL


# --------------------------------------------------------------------------- torchvision's layout
TORCHVISION = ("convnext_tiny", "convnext_small", "convnext_base", "convnext_large")


@pytest.mark.parametrize("name", TORCHVISION)
def test_torchvision_names_are_the_adapters(name):
    """torchvision's named ConvNeXts (meta device, no weights): the adapter is found by their
    keys and maps them onto the zoo's named config, every shape included (layer scale
    reshaped), and back in torchvision's order."""
    torchvision = pytest.importorskip("torchvision")
    with torch.device("meta"):
        state = {k: np.zeros(tuple(v.shape), np.float32) for k, v in
                 torchvision.models.get_model(name, weights=None).state_dict().items()}
    adapter = converters.adapters.find(state, "convnext")
    assert adapter is not None and adapter.name == "torchvision-convnext"
    zoo_state = adapter.to_zoo(state)
    spec = schema(zoo.make_config(name))[1]
    assert {k: v.shape for k, v in zoo_state.items()} == {k: tuple(v.shape)
                                                          for k, v in spec.items()}
    assert list(adapter.from_zoo({k: zoo_state[k] for k in spec})) == list(state)


def _torchvision_convnext():
    """torchvision's ConvNeXt class, one block per stage of widths 8, 16, 24, 32, 7 classes."""
    pytest.importorskip("torchvision")
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, 24, 1),
                     CNBlockConfig(24, 32, 1), CNBlockConfig(32, None, 1)], num_classes=7)


@functools.cache
def torchvision_reference():
    """torchvision's ConvNeXt class at one block per stage and small widths, every array
    perturbed (layer scale starts at 1e-6), its zoo config and an input."""
    torch.manual_seed(0)
    model = _torchvision_convnext()
    with torch.no_grad():
        for v in model.state_dict().values():
            v.add_(0.1 * torch.randn_like(v))
    config = zoo.make_config("convnext_tiny", depths=(1, 1, 1, 1), dims=(8, 16, 24, 32),
                             num_classes=7, input_size=SIZE)
    x = np.random.default_rng(6).standard_normal((2, 3, *SIZE)).astype(np.float32)
    return model.eval(), config, x


def _torchvision_forward(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_torchvision_state_dict_computes_torchvisions_outputs(impl):
    model_tv, config, x = torchvision_reference()
    state = {k: v.numpy() for k, v in model_tv.state_dict().items()}
    zoo_state = converters.adapters.get("torchvision-convnext").to_zoo(state)
    model = converters.from_canonical(zoo_state, config, impl)
    api = zoo.native_interface(impl)
    got = np.asarray(api.to_canonical(np.asarray(api.forward(model, api.to_native(x)))))
    assert relative(got, _torchvision_forward(model_tv, x)) < RTOL


def test_torchvision_files_convert_both_ways_by_one_command(tmp_path, capsys):
    """A torchvision state_dict into NNX by one command (its layout recognised and named),
    and back by one command into a file torchvision loads strictly: the same arrays, bitwise,
    and torchvision's outputs."""
    from tests.converter_cli import cli

    model_tv, config, x = torchvision_reference()
    src = tmp_path / "convnext_tv.pt"
    torch.save(model_tv.state_dict(), src)
    overrides = {k: getattr(config, k) for k in ("depths", "dims", "num_classes", "input_size")}
    code, out, err = cli(capsys, "convert", src, tmp_path / "nnx", "--to", "nnx", "--arch",
                         "convnext_tiny", "--config", json.dumps(overrides))
    assert code == 0, err
    assert "layout: torchvision ConvNeXt (torchvision-convnext)" in out
    nnx_model = converters.load(tmp_path / "nnx", "nnx")
    api = zoo.native_interface("nnx")
    got = np.asarray(api.to_canonical(np.asarray(api.forward(nnx_model, api.to_native(x)))))
    assert relative(got, _torchvision_forward(model_tv, x)) < RTOL
    back = tmp_path / "back.pt"
    code, out, err = cli(capsys, "convert", tmp_path / "nnx", back, "--to", "torch",
                         "--layout", "torchvision-convnext")
    assert code == 0, err
    assert "in the layout torchvision-convnext" in out
    fresh = _torchvision_convnext()
    fresh.load_state_dict(torch.load(back, weights_only=True), strict=True)
    for k, v in model_tv.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert relative(_torchvision_forward(fresh.eval(), x), _torchvision_forward(model_tv, x)) == 0


if __name__ == "__main__":
    write_fixture()
