"""Configurable depth: repeated parts are lists, named alike in every library, of any length.

The registry-wide tests run the tiny configs and their variants (`mlp-gelu-deep`: three hidden
layers, `cnn-nobn-deep`: three stages). Here, the depths those do not reach: an MLP without a
hidden layer, a three-stage CNN with BatchNorm, decoders of 0, 1 and 4 stages, through every
implementation (forward in training and evaluation against PyTorch, bitwise round trips), the
defaults' layouts, and the config errors.
"""

from __future__ import annotations

import functools
import json

import jax
import numpy as np
import pytest

import converters
import zoo
from tests.conftest import HAVE_TORCH, torch_marked
from zoo.testing import assert_close


def _decoder(channels: tuple[int, ...]) -> zoo.Config:
    """A tiny decoder with `len(channels)` stages: stride 2 for the first layer, 1 after."""
    n = len(channels) + 1
    return zoo.tiny_config("decoder3d", channels=channels, kernel_size=(3,) * n,
                           stride=(2,) + (1,) * (n - 1), padding=(1,) * n,
                           output_padding=(1,) + (0,) * (n - 1), dilation=(1,) * n,
                           conv_method="lhs_dilation")  # the cheapest to compile


CASES = {
    "mlp-no-hidden": (zoo.tiny_config("mlp", hidden=()), ["layers.0"]),
    "cnn-3-stages": (zoo.tiny_config("cnn", features=(4, 6, 5)),
                     ["convs.0", "bns.0", "convs.1", "bns.1", "convs.2", "bns.2", "fc1", "fc2"]),
    "decoder3d-0-stages": (_decoder(()), ["head"]),
    "decoder3d-1-stage": (_decoder((5,)), ["ups.0", "head"]),
    "decoder3d-4-stages": (_decoder((5, 4, 3, 3)), ["ups.0", "ups.1", "ups.2", "ups.3", "head"]),
}


@pytest.mark.parametrize("impl", torch_marked(zoo.IMPLS))
@pytest.mark.parametrize("case", CASES)
def test_layers_are_named_as_list_items_in_every_library(case, impl):
    config, names = CASES[case]
    spec = converters.canonical_spec(config, impl=impl)
    assert {k.rsplit(".", 1)[0] for k in spec} == set(names)
    assert {k: v.shape for k, v in spec.items()} == {
        k: v.shape for k, v in converters.canonical_spec(config, impl="eqx").items()}
    if config.arch == "decoder3d":
        assert list(config.layer_names()) == names


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
@pytest.mark.parametrize("case", CASES)
def test_every_library_computes_the_same_function(case):
    """Each JAX library, converted from PyTorch, gives PyTorch's outputs (training and
    evaluation), and its canonical state back bitwise."""
    import torch

    config, _ = CASES[case]
    reference = zoo.create(config, "torch", seed=3)
    state = {k: np.array(v) for k, v in converters.to_canonical(reference, "torch").items()}
    models = {impl: converters.convert(reference, "torch", impl) for impl in zoo.JAX_IMPLS}
    x = zoo.example_input(config, batch=3, seed=1)
    expected = {}  # (training updates the statistics of `reference`: converted before)
    for train in (False, True):
        with torch.no_grad():
            expected[train] = reference.train(train)(torch.from_numpy(np.array(x))).numpy()
        assert not np.allclose(expected[train][0], expected[train][1]), "output ignores input"
    for impl, model in models.items():
        back = converters.to_canonical(model, impl)
        assert back.keys() == state.keys()
        for k, v in state.items():
            if not k.endswith("num_batches_tracked"):  # JAX libraries keep no counter
                assert np.asarray(back[k]).tobytes() == np.asarray(v).tobytes(), (impl, k)
        api = zoo.interface(impl)
        static, params, bn_state = api.split(model)
        for train in (False, True):
            apply = jax.jit(functools.partial(api.apply, static, train=train))
            y, _ = apply(params, bn_state, api.to_native(x))
            assert_close(np.asarray(api.to_canonical(y)), expected[train])


def test_defaults_are_unchanged():
    shapes = lambda arch: {k: v.shape for k, v in converters.canonical_spec(
        zoo.make_config(arch)).items() if k.endswith("weight")}
    assert shapes("mlp") == {"layers.0.weight": (512, 784), "layers.1.weight": (512, 512),
                             "layers.2.weight": (10, 512)}
    assert shapes("cnn") == {"convs.0.weight": (32, 1, 3, 3), "bns.0.weight": (32,),
                             "convs.1.weight": (64, 32, 3, 3), "bns.1.weight": (64,),
                             "fc1.weight": (256, 64 * 7 * 7), "fc2.weight": (10, 256)}
    assert shapes("decoder3d") == {"ups.0.weight": (32, 16, 4, 4, 4),
                                   "ups.1.weight": (16, 8, 4, 4, 4),
                                   "ups.2.weight": (8, 4, 4, 4, 4), "head.weight": (4, 4, 3, 3, 3)}
    assert zoo.make_config("decoder3d").output_shape == (4, 64, 64, 64)


def test_cnn_flatten_shape_follows_the_stages():
    cnn = lambda features, size: zoo.make_config("cnn", features=features, input_size=size)
    assert cnn((4,), (9, 7)).flatten_shape == (4, 4, 3)
    assert cnn((4, 6, 5), (17, 8)).flatten_shape == (5, 2, 1)  # floor at every stage
    assert cnn((4, 6, 5, 3), (16, 31)).flatten_shape == (3, 1, 1)


@pytest.mark.parametrize(("arch", "overrides", "message"), [
    ("mlp", {"hidden": (8, 0)}, "mlp.hidden must be positive"),
    ("mlp", {"hidden": (8, 7.5)}, "MLPConfig.hidden: expected a list, each item an integer"),
    ("cnn", {"features": ()}, "cnn.features needs at least one stage"),
    ("cnn", {"features": (4, -1)}, "cnn.features must be positive"),
    ("cnn", {"features": (4, 4, 4), "input_size": (7, 9)},
     r"cnn.input_size must be at least 8x8 for 3 stage\(s\) \(each halves it\), found \(7, 9\)"),
    ("decoder3d", {"channels": (5,)}, r"decoder3d.kernel_size needs 2 entries \(one per "
                                      r"conv-transpose: 1 stage\(s\), then the head\)"),
    ("decoder3d", {"channels": (5, 4, 3, 3)}, "decoder3d.kernel_size needs 5 entries"),
    ("decoder3d", {"channels": (5, 0, 3)}, "decoder3d.channels must be positive"),
])
def test_depth_errors_name_the_argument(arch, overrides, message):
    with pytest.raises(zoo.ConfigError, match=message):
        zoo.tiny_config(arch, **overrides)


def test_configs_of_any_depth_round_trip_through_json():
    """Tuples of any length survive JSON (lists) and stay hashable (jit static arguments)."""
    for config, _ in CASES.values():
        again = zoo.configs.config_from_dict(json.loads(config.to_json()))
        assert again == config and hash(again) == hash(config)
