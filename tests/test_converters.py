"""Converters: exact round trips, dtypes, same-seed identity, and clear errors on bad input."""

from __future__ import annotations

import copy
import itertools

import jax
import numpy as np
import pytest

import converters
import zoo
from converters import ConversionError
from tests.conftest import CASE_IDS, CASES, HAVE_TORCH, torch_marked
from tests.kind_cover import cover, latin

IMPLS = [i for i in zoo.IMPLS if i != "torch" or HAVE_TORCH]  # the libraries installed
DTYPES = ["float32", "bfloat16", "float16"]


def _np(state):
    return {k: np.asarray(converters.as_numpy_state({k: v})[k]) for k, v in state.items()}


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert set(a) == set(b), set(a) ^ set(b)
    a, b = _np(a), _np(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, (k, a[k].dtype, b[k].dtype)
        assert a[k].shape == b[k].shape, (k, a[k].shape, b[k].shape)
        assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"


def _distinct_state(config, dtype="float32"):
    """A canonical state with no repeated values (BatchNorm statistics randomised too), so a
    misplaced transpose or a swapped pair of arrays cannot go unnoticed."""
    state = zoo.canonical_init(config, seed=5, dtype=dtype)
    keys = jax.random.split(jax.random.key(11), len(state))
    out = {}
    for key, (name, v) in zip(keys, state.items(), strict=True):
        if np.issubdtype(v.dtype, np.integer):
            out[name] = np.asarray(7, np.int64) if "num_batches" in name else v
        else:
            r = np.asarray(jax.random.uniform(key, v.shape, minval=0.5, maxval=1.5))
            out[name] = r.astype(v.dtype)
    return out


# Every case through two libraries, the libraries and the dtype turning (a cover,
# tests.kind_cover; --exhaustive: every case in every dtype everywhere).
@pytest.mark.parametrize(("case", "impl", "dtype"), cover(
    CASE_IDS, latin(torch_marked(zoo.IMPLS), DTYPES), per_case=len(zoo.IMPLS) // 2))
def test_round_trip_through_each_library_is_bitwise(case, impl, dtype):
    config = dict(CASES)[case]
    state = _distinct_state(config, dtype)
    before = copy.deepcopy(state)
    model = converters.from_canonical(state, config, impl)
    back = converters.to_canonical(model, impl)
    assert_bitwise_equal(state, before)  # the input was not modified
    if impl != "torch":  # JAX libraries keep no batch counter: it comes back as 0
        back = {k: (state[k] if k.endswith("num_batches_tracked") else v) for k, v in back.items()}
    assert_bitwise_equal(back, state)


# Every architecture through two library pairs, the pairs turning (a cover: all 12 reached;
# --exhaustive: every architecture through every pair).
@pytest.mark.parametrize(("arch", "src", "dst"), cover(
    zoo.ARCHS, torch_marked(itertools.permutations(zoo.IMPLS, 2)), per_case=2))
def test_convert_between_every_pair_is_bitwise(arch, src, dst):
    model = zoo.create(zoo.tiny_config(arch), src, seed=1)
    out = converters.convert(model, src, dst)
    a, b = converters.to_canonical(model, src), converters.to_canonical(out, dst)
    strip = lambda s: {k: v for k, v in s.items() if not k.endswith("num_batches_tracked")}
    assert_bitwise_equal(strip(a), strip(b))


@pytest.mark.parametrize("arch", zoo.ARCHS)
def test_same_seed_gives_identical_models_everywhere(arch):
    config = zoo.tiny_config(arch)
    states = [converters.to_canonical(zoo.create(config, impl, seed=4), impl) for impl in IMPLS]
    for other in states[1:]:
        assert_bitwise_equal(states[0], other)
    different = converters.to_canonical(zoo.create(config, "eqx", seed=5), "eqx")
    assert any(not np.array_equal(np.asarray(different[k]), np.asarray(states[0][k]))
               for k in different if k.endswith("weight"))


def test_canonical_init_follows_the_documented_scheme():
    config = zoo.tiny_config("cnn")
    state = zoo.canonical_init(config, seed=0)
    w = state["convs.0.weight"]
    bound = 1 / np.sqrt(w.shape[1] * 9)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert np.all(state["bns.0.weight"] == 1) and np.all(state["bns.0.running_var"] == 1)
    assert state["bns.0.num_batches_tracked"].dtype == np.int64
    dec = zoo.canonical_init(zoo.tiny_config("decoder3d"), seed=0)
    w = dec["ups.0.weight"]  # ConvTranspose: PyTorch's fan_in is weight.shape[1] * prod(k)
    assert np.abs(w).max() <= 1 / np.sqrt(w.shape[1] * 64)


def test_native_init_keeps_library_initialisers():
    config = zoo.tiny_config("mlp")
    _, variables = zoo.create(config, "linen", init="native")
    assert np.all(np.asarray(variables["params"]["layers_0"]["bias"]) == 0)  # Flax: zeros bias
    eqx_model = zoo.create(config, "eqx", init="native")
    assert np.any(np.asarray(eqx_model.layers[0].bias) != 0)  # Equinox: uniform bias


@pytest.mark.parametrize("impl", torch_marked(zoo.IMPLS))
def test_float32_statistics_under_bfloat16_parameters_are_kept(impl):
    """Flax keeps BatchNorm statistics in float32 whatever the parameter dtype."""
    config = zoo.tiny_config("cnn")
    state = converters.to_canonical(zoo.create(config, "linen", init="native",
                                               dtype="bfloat16"), "linen")
    assert state["bns.0.running_var"].dtype == np.float32
    assert state["fc1.weight"].dtype != np.float32
    back = converters.to_canonical(converters.from_canonical(state, config, impl), impl)
    strip = lambda s: {k: v for k, v in s.items() if not k.endswith("num_batches_tracked")}
    assert_bitwise_equal(strip(back), strip(state))


# ----------------------------------------------------------------------------- bad input
@pytest.fixture
def cnn_state():
    return zoo.canonical_init(zoo.tiny_config("cnn"), seed=0)


def _error(state, config, impl="nnx") -> str:
    before = copy.deepcopy(state)
    with pytest.raises(ConversionError) as info:
        converters.from_canonical(state, config, impl)
    assert_bitwise_equal(state, before)
    return str(info.value)


def test_every_offending_key_is_listed(cnn_state):
    config = zoo.tiny_config("cnn")
    cnn_state.pop("fc2.bias")
    cnn_state.pop("bns.0.running_var")
    cnn_state["extra.weight"] = np.zeros(3, np.float32)
    cnn_state["convs.1.weight"] = np.zeros((6, 4, 5, 5), np.float32)
    msg = _error(cnn_state, config)
    assert "4 problem(s)" in msg
    assert "missing key 'fc2.bias' (expected shape (5,))" in msg
    assert "missing key 'bns.0.running_var'" in msg
    assert "unexpected key 'extra.weight'" in msg
    assert "'convs.1.weight': expected shape (6, 4, 3, 3), found (6, 4, 5, 5)" in msg


def test_dtype_errors(cnn_state):
    config = zoo.tiny_config("cnn")
    cnn_state["fc1.weight"] = cnn_state["fc1.weight"].astype(np.float16)
    assert "'fc1.weight': expected dtype float32, found float16" in _error(cnn_state, config)
    cnn_state["fc1.weight"] = cnn_state["fc1.weight"].astype(np.float32)
    cnn_state["bns.1.num_batches_tracked"] = np.zeros((), np.float32)
    assert "integer counter" in _error(cnn_state, config)


def test_wrong_architecture_is_named(cnn_state):
    msg = _error(cnn_state, zoo.tiny_config("mlp"), "eqx")
    assert "state does not fit mlp" in msg and "is this a mlp checkpoint" in msg


def test_not_a_mapping():
    with pytest.raises(ConversionError, match="mapping"):
        converters.from_canonical([1, 2], "mlp", "eqx")


def test_unknown_impl_and_arch():
    with pytest.raises(ValueError, match="unknown implementation 'jaxx'"):
        converters.to_canonical(object(), "jaxx")
    with pytest.raises(ValueError, match="unknown model 'resnet9': did you mean 'resnet'"):
        zoo.create("resnet9", "eqx")


def test_eqx_model_with_state_needs_the_state():
    model, _ = zoo.create(zoo.tiny_config("cnn"), "eqx")
    with pytest.raises(ValueError, match=r"pass \(model, state\)"):
        converters.to_canonical(model, "eqx")


def test_config_json_round_trip_and_errors():
    for arch in zoo.ARCHS:
        config = zoo.tiny_config(arch)
        assert zoo.configs.config_from_dict(__import__("json").loads(config.to_json())) == config
    with pytest.raises(zoo.ConfigError, match="unknown cnn config keys"):
        zoo.architecture("cnn").config.from_dict({"arch": "cnn", "kernel": 3})
    with pytest.raises(zoo.ConfigError, match="output_padding"):
        zoo.tiny_config("decoder3d", output_padding=(2, 0, 0, 0))
