"""Bring your own checkpoint: checkpoints and models the zoo did not build, matched
layer by layer, converted to every library and checked forward-equal; every ambiguous, partial
or misshaped input refused with the mapping table and a suggested --map."""

from __future__ import annotations

import importlib.util
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import converters
import zoo
from converters.matching import transfer
from converters.matching.verify import forward, max_difference, tolerance
from tests.converter_cli import cli
from tests.foreign_models import NNXMNIST, EqxPair, LinenMNIST, LinenPair, torch_sequential_mlp

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs the torch extra")
IMPLS = ("eqx", "linen", "nnx", "torch") if HAVE_TORCH else ("eqx", "linen", "nnx")
MNIST = (1, 28, 28)


def save_orbax(path, tree) -> None:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:  # as the Flax docs save
        ckptr.save(path.absolute(), tree)
        ckptr.wait_until_finished()


def layer_names(config: zoo.Config) -> list[str]:
    """The zoo's own layer names, in model order (never hard-coded here)."""
    return [layer.name for layer in converters.canonical_layers(config)]


def assert_every_library(path, config, reference: np.ndarray, x: np.ndarray) -> None:
    """The converted checkpoint loads into every library and reproduces the source's output."""
    for impl in IMPLS:
        out = forward(converters.load(path, impl), impl, x)
        assert max_difference(reference, out) <= tolerance(), impl


def has_row(out: str, source: str, target: str) -> bool:
    """The printed table (rich or plain, whatever the terminal width) pairs source -> target."""
    row = re.compile(rf"(^|[\s│]){re.escape(source)}[\s│]+{re.escape(target)}([\s│]|$)")
    return any(row.search(line) for line in out.splitlines())



def eqx_pair() -> EqxPair:
    """A skeleton (abstract arrays): a target needs no values, and nothing compiles."""
    import equinox as eqx

    return eqx.filter_eval_shape(EqxPair, jax.random.key(0))


def random_variables(module, shape: tuple[int, ...], seed: int = 0) -> dict:
    """Linen variables of `module` for an input of `shape`, drawn with numpy (no compiles)."""
    rng = np.random.default_rng(seed)
    abstract = jax.eval_shape(module.init, jax.random.key(0), jnp.zeros(shape))
    return jax.tree.map(lambda a: (0.3 * rng.standard_normal(a.shape)).astype(a.dtype), abstract)


# --------------------------------------------------------------------------- the three cases
@needs_torch
def test_torch_sequential_mlp(tmp_path, capsys):
    import torch

    config = zoo.tiny_config("mlp")
    torch.manual_seed(0)
    seq = torch_sequential_mlp((config.in_features, *config.hidden, config.out_features))
    torch.save(seq.state_dict(), tmp_path / "seq.pt")
    dst = tmp_path / "mlp_nnx"
    code, out, err = cli(capsys, "convert", tmp_path / "seq.pt", dst, "--to", "nnx", "--arch",
                         "mlp", "--config", config.to_json())
    assert code == 0, err
    names = layer_names(config)
    for source, target in zip(("0", "2", "4"), names, strict=True):
        assert has_row(out, source, target), (source, target, out)
    assert ("checked: the layout (the zoo's torch and nnx models holding the arrays differ by "
            in out)
    assert ("not checked: the mapping (evidence used: shape; the source model did not run, only "
            "a file was given)") in out
    assert "verified" not in out  # the source model never ran: nothing verifies the mapping
    x = np.random.default_rng(1).standard_normal((3, *config.input_shape)).astype(np.float32)
    assert_every_library(dst, config, forward(seq, "torch", x), x)


def test_linen_mnist_example(tmp_path, capsys):
    module = LinenMNIST()
    variables = random_variables(module, (1, 28, 28, 1))
    save_orbax(tmp_path / "linen_mnist", variables)
    config = zoo.make_config("cnn", batch_norm=False)
    dst = tmp_path / "cnn.safetensors"
    code, out, err = cli(capsys, "convert", tmp_path / "linen_mnist", dst, "--to", "canonical",
                         "--arch", "cnn", "--config", '{"batch_norm": false}')
    assert code == 0, err
    for source, target in zip(("Conv_0", "Conv_1", "Dense_0", "Dense_1"), layer_names(config),
                              strict=True):
        assert has_row(out, source, target), (source, target, out)
    assert f"flattened map (C, *spatial) = {config.flatten_shape}, from the config" in out
    x = np.random.default_rng(1).standard_normal((2, *MNIST)).astype(np.float32)
    assert_every_library(dst, config, forward((module, variables), "linen", x), x)


def _trained_nnx_mnist() -> NNXMNIST:
    """The tutorial's model with random weights after three train-mode steps (its BatchNorm
    statistics moved), built abstractly and filled with numpy so that one call compiles."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: NNXMNIST(rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(3)

    def fill(path, a):
        name = str(path[-2].key) if len(path) > 1 else ""
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            return jax.random.key(0)
        if not jnp.issubdtype(a.dtype, jnp.floating):
            return np.zeros(a.shape, a.dtype)
        if name in ("mean", "var", "scale"):  # BatchNorm's initial values
            return np.full(a.shape, float(name != "mean"), a.dtype)
        fan_in = np.prod(a.shape[:-1]) if a.ndim > 1 else 1
        return (rng.standard_normal(a.shape) / np.sqrt(fan_in)).astype(a.dtype)

    state = jax.tree_util.tree_map_with_path(fill, state)

    def train_step(state, x):
        model = nnx.merge(graphdef, state)
        model.train()
        model(x)
        return nnx.state(model)

    step = jax.jit(train_step)
    for _ in range(3):
        state = step(state, jnp.asarray(rng.standard_normal((4, 28, 28, 1)) + 0.5, jnp.float32))
    return nnx.merge(graphdef, state)


def test_nnx_mnist_tutorial(tmp_path, capsys):
    model = _trained_nnx_mnist()
    assert float(jnp.abs(model.batch_norm1.mean.get_value()).max()) > 1e-3
    _, state = nnx.split(model)
    save_orbax(tmp_path / "state", state)
    config = zoo.make_config("cnn")
    dst = tmp_path / "cnn.eqx"
    code, out, err = cli(capsys, "convert", tmp_path / "state", dst, "--to", "eqx", "--arch",
                         "cnn")
    assert code == 0, err
    names = layer_names(config)
    kinds = {layer.name: layer.kind for layer in converters.canonical_layers(config)}
    pairs = {"conv1": "conv", "conv2": "conv", "batch_norm1": "batch_norm",
             "batch_norm2": "batch_norm", "linear1": "linear", "linear2": "linear"}
    assert sorted(kinds[n] for n in names) == sorted(pairs.values())
    x = np.random.default_rng(1).standard_normal((2, *MNIST)).astype(np.float32)
    assert_every_library(dst, config, forward(model, "nnx", x), x)
    # inspect proposes the same mapping and the command that converts with it
    code, out, err = cli(capsys, "inspect", tmp_path / "state", "--arch", "cnn")
    assert code == 0, err
    assert "converts with this mapping: python -m converters convert" in out
    assert any(has_row(out, "batch_norm1", n) for n in names)


# --------------------------------------------------------------------------- other sources
def test_hf_prefix_and_eqx_mlp_and_live_models():
    config = zoo.tiny_config("mlp")
    state = converters.to_canonical(zoo.create(config, "nnx", seed=1), "nnx")
    prefixed = {f"model.{k}": v for k, v in state.items()}
    res = converters.matching.import_state(prefixed, "torch", config)
    assert {r.rule for r in res.rows} == {"name ('model.' stripped)"}
    assert res.state.keys() == state.keys()
    # eqx.nn.MLP (layers[0], layers[1], ...) into the zoo's Linen MLP, verified on the spot
    import equinox as eqx

    mlp = eqx.filter_jit(lambda k: eqx.nn.MLP(config.in_features, config.out_features,
                                              config.hidden[0], depth=2, key=k))(
        jax.random.key(0))
    if config.hidden[0] != config.hidden[1]:
        mlp = eqx.tree_at(lambda m: m.layers[1], mlp, eqx.nn.Linear(
            config.hidden[0], config.hidden[1], key=jax.random.key(1)))
        mlp = eqx.tree_at(lambda m: m.layers[2], mlp, eqx.nn.Linear(
            config.hidden[1], config.out_features, key=jax.random.key(2)))
    target = zoo.create(config, "linen", seed=0)
    res = transfer(mlp, "eqx", target, "linen", input_shape=config.input_shape)
    assert res.max_difference is not None and res.max_difference <= res.tolerance
    assert [r.target for r in res.rows] == layer_names(config)


@needs_torch
def test_live_torch_source_into_a_users_nnx_model_leaves_both_untouched():
    import torch

    config = zoo.tiny_config("mlp")
    torch.manual_seed(0)
    seq = torch_sequential_mlp((config.in_features, *config.hidden, config.out_features))
    before = {k: v.clone() for k, v in seq.state_dict().items()}
    target = zoo.create(config, "nnx", seed=3)
    kept = jax.tree.map(np.asarray, nnx.state(target))
    res = transfer(seq, "torch", target, "nnx")
    assert res.max_difference <= res.tolerance
    assert [r.rule for r in res.rows] == ["shape"] * 3
    jax.tree.map(np.testing.assert_array_equal, kept, jax.tree.map(np.asarray,
                                                                   nnx.state(target)))
    assert all(torch.equal(before[k], v) for k, v in seq.state_dict().items())
    assert seq.training  # eval mode was set on a copy


def test_user_model_pair_both_ways():
    """A user's architecture written in Linen and Equinox, not in the zoo: weights move both
    ways, the flattened map's shape traced from a model, outputs equal."""
    shape = (2, 8, 6)
    module = LinenPair()
    variables = random_variables(module, (1, 8, 6, 2), seed=1)
    res = transfer((module, variables), "linen", eqx_pair(), "eqx",
                   input_shape=shape)
    assert res.flatten_shape == (6, 4, 3) and "traced" in res.flatten_from
    assert res.max_difference <= res.tolerance
    assert [r.source for r in res.rows] == ["stem", "body", "proj", "out"]
    back = transfer(res.model, "eqx", (module, jax.tree.map(jnp.zeros_like, variables)),
                    "linen", input_shape=shape)
    assert back.max_difference <= back.tolerance
    np.testing.assert_array_equal(back.model[1]["params"]["proj"]["kernel"],
                                  variables["params"]["proj"]["kernel"])
    # a wrong flatten order is caught by the verification, and nothing is returned
    with pytest.raises(converters.ConversionError, match="verification failed"):
        transfer((module, variables), "linen", eqx_pair(), "eqx",
                 input_shape=shape, flatten_shape=(3, 4, 6))


def test_like_cli_targets_a_users_model(tmp_path, capsys, monkeypatch):
    import equinox as eqx

    module = LinenPair()
    variables = random_variables(module, (1, 8, 6, 2), seed=1)
    save_orbax(tmp_path / "users_linen", variables)
    (tmp_path / "users_models.py").write_text(
        "import jax\nfrom tests.foreign_models import EqxPair\n\n"
        "import equinox as eqx\n\n"
        "def skeleton():\n    return eqx.filter_eval_shape(EqxPair, jax.random.key(0))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    dst = tmp_path / "users.eqx"
    code, out, err = cli(capsys, "convert", tmp_path / "users_linen", dst, "--to", "eqx",
                         "--like", "users_models:skeleton", "--input-shape", "2,8,6")
    assert code == 0, err
    assert "layers.2" in out and "not verified" in out
    assert "(6, 4, 3), from the eqx model's reshape (traced)" in out  # from the skeleton
    loaded = eqx.tree_deserialise_leaves(dst, eqx_pair())
    x = np.random.default_rng(0).standard_normal((2, 2, 8, 6)).astype(np.float32)
    ref = forward((module, variables), "linen", x)
    assert max_difference(ref, forward(loaded, "eqx", x)) <= tolerance()


# --------------------------------------------------------------------------- refusals
def _state_file(tmp_path, state: dict, name: str = "s.safetensors"):
    from safetensors.numpy import save_file

    save_file({k: np.asarray(v, np.float32) for k, v in state.items()}, str(tmp_path / name))
    return tmp_path / name


def _mlp_like(sizes: tuple[int, ...], names: list[str], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for n, a, b in zip(names, sizes[:-1], sizes[1:], strict=True):
        out[f"{n}.weight"] = rng.standard_normal((b, a)).astype(np.float32)
        out[f"{n}.bias"] = rng.standard_normal((b,)).astype(np.float32)
    return out


SQUARE = '{"in_features": 8, "hidden": [8, 8], "out_features": 3}'


def test_ambiguous_refused_then_fixed_with_map(tmp_path, capsys):
    config = zoo.make_config("mlp", in_features=8, hidden=(8, 8), out_features=3)
    names = layer_names(config)
    src = _state_file(tmp_path, _mlp_like((8, 8, 8, 3), ["alpha", "beta", "head"]))
    dst = tmp_path / "o.eqx"
    code, out, err = cli(capsys, "convert", src, dst, "--to", "eqx", "--arch", "mlp",
                         "--config", SQUARE)
    assert code == 1 and not dst.exists()
    assert "ambiguous" in err and "--map" in err and "source shape" in err  # the table
    code, out, err = cli(capsys, "convert", src, dst, "--to", "eqx", "--arch", "mlp",
                         "--config", SQUARE, "--map", f"alpha={names[0]}")
    assert code == 0, err
    assert f"map alpha={names[0]}" in out and dst.exists()


def test_partial_and_misshaped_refused(tmp_path, capsys):
    config = zoo.tiny_config("mlp")
    sizes = (config.in_features, *config.hidden, config.out_features)
    dst = tmp_path / "o_nnx"
    partial = _state_file(tmp_path, _mlp_like(sizes[:3], ["a1", "a2"]), "partial.safetensors")
    code, _, err = cli(capsys, "convert", partial, dst, "--to", "nnx", "--arch", "mlp",
                       "--config", config.to_json())
    assert code == 1 and "unmatched target layer" in err and not dst.exists()
    wrong = (*sizes[:2], sizes[2] + 1, sizes[3])
    bad = _state_file(tmp_path, _mlp_like(wrong, ["l0", "l1", "l2"]), "bad.safetensors")
    code, _, err = cli(capsys, "convert", bad, dst, "--to", "nnx", "--arch", "mlp",
                       "--config", config.to_json())
    assert code == 1 and "unmatched source layer" in err and "fix:" in err
    assert not dst.exists()
    # a --map onto a layer of another shape names both shapes
    code, _, err = cli(capsys, "convert", bad, dst, "--to", "nnx", "--arch", "mlp",
                       "--config", config.to_json(), "--map", f"l2={layer_names(config)[0]}")
    assert code == 1 and "shape" in err and not dst.exists()


def test_bad_map_rule_is_a_clear_error(tmp_path, capsys):
    config = zoo.tiny_config("mlp")
    src = _state_file(tmp_path, _mlp_like((config.in_features, *config.hidden,
                                           config.out_features), ["a", "b", "c"]))
    code, _, err = cli(capsys, "convert", src, tmp_path / "o.eqx", "--to", "eqx", "--arch",
                       "mlp", "--config", config.to_json(), "--map", "([=x")
    assert code == 1 and "--map" in err and "Traceback" not in err


def test_cli_prefixed_state_dict_and_show_mapping(tmp_path, capsys):
    config = zoo.tiny_config("mlp")
    state = converters.to_canonical(zoo.create(config, "eqx", seed=4), "eqx")
    src = _state_file(tmp_path, {f"model.{k}": v for k, v in state.items()}, "hf.safetensors")
    dst = tmp_path / "o.safetensors"
    code, out, err = cli(capsys, "convert", src, dst, "--to", "canonical", "--arch", "mlp",
                         "--config", config.to_json())
    assert code == 0, err
    assert "name ('model.' stripped)" in out and "(evidence used: name;" in out
    back = converters.load(dst)
    assert all(np.array_equal(back.state[k], v) for k, v in state.items())
    # exact names: no table unless asked; with --show-mapping every row says "name"
    plain = _state_file(tmp_path, state, "plain.safetensors")
    code, out, err = cli(capsys, "convert", plain, tmp_path / "p.eqx", "--to", "eqx", "--arch",
                         "mlp", "--config", config.to_json(), "--show-mapping")
    assert code == 0, err
    assert all(has_row(out, n, n) for n in layer_names(config))


def _nnx_sequential_mlp(config: zoo.Config) -> nnx.Sequential:
    """`nnx.Sequential(Linear, relu, Linear, relu, Linear)`: its layers are `layers.0/2/4`, and
    `layers.2` is also a zoo layer name, of another shape."""
    sizes = (config.in_features, *config.hidden, config.out_features)
    rngs = nnx.Rngs(0)
    layers: list = []
    for a, b in itertools.pairwise(sizes):
        layers += [nnx.Linear(a, b, rngs=rngs), nnx.relu]
    return nnx.Sequential(*layers[:-1])


@pytest.mark.parametrize("maps", [(), (r"layers\.2=layers.1", r"layers\.4=layers.2")])
def test_a_misshaped_name_match_is_no_veto_and_map_wins(tmp_path, capsys, maps):
    config = zoo.tiny_config("mlp")
    seq = _nnx_sequential_mlp(config)
    save_orbax(tmp_path / "seq", nnx.state(seq))
    dst = tmp_path / "o.eqx"
    flags = [f"--map={m}" for m in maps]
    code, out, err = cli(capsys, "convert", tmp_path / "seq", dst, "--to", "eqx", "--arch", "mlp",
                         "--config", config.to_json(), *flags)
    assert code == 0, err
    assert has_row(out, "layers.4", "layers.2") and has_row(out, "layers.2", "layers.1")
    if maps:
        assert f"map {maps[0]}" in out
    x = np.random.default_rng(3).standard_normal((2, config.in_features)).astype(np.float32)
    got = forward(converters.load(dst, "eqx"), "eqx", x)
    assert max_difference(np.asarray(seq(jnp.asarray(x))), got) <= tolerance()


def test_a_flat_state_dict_of_composite_layers_matches_by_name():
    """A state dict in the canonical layout holds an attention layer as `attn.qkv` and
    `attn.proj` keys: matching takes them together as the one attention layer (the zoo's own
    ViT state dict through `import_state`, every layer by its name)."""
    config = zoo.tiny_config("vit")
    state = {k: np.asarray(v) for k, v in zoo.canonical_init(config, seed=4).items()}
    res = converters.matching.import_state(state, "torch", config)
    assert {r.rule for r in res.rows} == {"name"}
    assert "blocks.0.attn" in {r.target for r in res.rows}
    for k, v in state.items():
        np.testing.assert_array_equal(res.state[k], v, err_msg=k)
