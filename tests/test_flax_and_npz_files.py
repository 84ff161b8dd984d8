"""Flax msgpack files (variables, and a TrainState as ``flax.training.checkpoints`` writes it,
with and without orbax) and NumPy ``.npz`` archives: detected by content, read without
pickles, converted with the command line and compared with the source model (BatchNorm
statistics perturbed); the training tree's optimizer state and step reported as left out."""

from __future__ import annotations

import warnings
import zipfile

import jax
import numpy as np
import optax
import pytest
from flax import serialization
from flax.training import checkpoints, train_state

import converters
import zoo
from converters.checkpoints import detect
from converters.matching.verify import forward, max_difference, tolerance
from tests.converter_cli import cli
from tests.foreign_models import LinenMNIST

CONFIG = zoo.tiny_config("resnet")
ARCH = ("--arch", "resnet", "--config", CONFIG.to_json())



def sample(shape=CONFIG.input_shape) -> np.ndarray:
    return np.random.default_rng(7).standard_normal((2, *shape)).astype(np.float32)


def linen_resnet(seed: int = 0):
    """The zoo's Linen ResNet (module, variables), BatchNorm statistics perturbed."""
    module, variables = zoo.create(CONFIG, "linen", seed=seed)
    rng = np.random.default_rng(seed)

    def perturb(path, a):
        name = str(path[-1].key)
        if name == "mean":
            return (0.2 * rng.standard_normal(a.shape)).astype(a.dtype)
        return (0.5 + rng.random(a.shape)).astype(a.dtype) if name == "var" else a

    stats = jax.tree_util.tree_map_with_path(perturb, dict(variables["batch_stats"]))
    return module, {"params": variables["params"], "batch_stats": stats}


class TrainState(train_state.TrainState):
    """The Flax ImageNet example's train state: BatchNorm statistics beside the params."""

    batch_stats: dict


def adam_state(module, variables) -> TrainState:
    ts = TrainState.create(apply_fn=module.apply, params=variables["params"],
                           tx=optax.adam(1e-3), batch_stats=variables["batch_stats"])
    grads = jax.tree.map(np.ones_like, ts.params)
    return ts.apply_gradients(grads=grads).replace(params=variables["params"])


def assert_reproduces(path, source, impl: str = "nnx", shape=CONFIG.input_shape) -> None:
    x = sample(shape)
    got = forward(converters.load(path, impl), impl, x)
    assert max_difference(forward(source, "linen", x), got) <= tolerance()


def test_linen_variables_msgpack_both_ways(tmp_path, capsys):
    module, variables = linen_resnet(0)
    src = tmp_path / "variables.msgpack"
    src.write_bytes(serialization.to_bytes(variables))
    assert detect(src).fmt == "msgpack"
    code, out, err = cli(capsys, "convert", src, tmp_path / "o_nnx", "--to", "nnx", *ARCH)
    assert code == 0, err
    assert "left out" not in out
    assert_reproduces(tmp_path / "o_nnx", (module, variables))
    back = tmp_path / "back.msgpack"
    code, _, err = cli(capsys, "convert", tmp_path / "o_nnx", back, "--to", "msgpack")
    assert code == 0, err
    restored = serialization.from_bytes(variables, back.read_bytes())  # Flax reads it back
    x = sample()
    np.testing.assert_array_equal(module.apply(restored, x.transpose(0, 2, 3, 1)),
                                  module.apply(variables, x.transpose(0, 2, 3, 1)))  # same arrays


@pytest.mark.parametrize("orbax", [True, False])
def test_flax_training_checkpoint_gives_its_variables(tmp_path, capsys, orbax):
    """``flax.training.checkpoints.save_checkpoint`` of a TrainState: an orbax directory, or
    a msgpack file when orbax checkpointing is off."""
    import flax

    module, variables = linen_resnet(1)
    old = flax.config.flax_use_orbax_checkpointing
    flax.config.update("flax_use_orbax_checkpointing", orbax)
    try:
        with warnings.catch_warnings():  # Flax announces its own checkpointing's deprecation
            warnings.simplefilter("ignore", DeprecationWarning)
            src = checkpoints.save_checkpoint(tmp_path / "ckpts", adam_state(module, variables),
                                              step=1)
    finally:
        flax.config.update("flax_use_orbax_checkpointing", old)
    assert detect(src).fmt == ("linen" if orbax else "msgpack")
    code, out, err = cli(capsys, "convert", src, tmp_path / "o.safetensors", "--to",
                         "canonical", *ARCH)
    assert code == 0, err
    note = next(line for line in out.splitlines() if "left out:" in line)
    assert "opt_state (optimizer state)" in note and "step (1)" in note
    assert "ambiguous" not in out
    assert_reproduces(tmp_path / "o.safetensors", (module, variables), "eqx")


def test_foreign_linen_train_state_is_matched(tmp_path, capsys):
    module = LinenMNIST()
    abstract = jax.eval_shape(module.init, jax.random.key(0), np.zeros((1, 28, 28, 1)))
    rng = np.random.default_rng(2)
    variables = jax.tree.map(lambda a: (0.3 * rng.standard_normal(a.shape)).astype(a.dtype),
                             abstract)
    ts = train_state.TrainState.create(apply_fn=module.apply, params=variables["params"],
                                       tx=optax.sgd(0.1, momentum=0.9))
    src = tmp_path / "mnist.msgpack"
    src.write_bytes(serialization.to_bytes(ts))
    dst = tmp_path / "cnn.eqx"
    code, out, err = cli(capsys, "convert", src, dst, "--to", "eqx", "--arch", "cnn",
                         "--config", '{"batch_norm": false}')
    assert code == 0, err
    assert "opt_state (optimizer state)" in out and "step (0)" in out
    x = sample((1, 28, 28))
    got = forward(converters.load(dst, "eqx"), "eqx", x)
    assert max_difference(forward((module, variables), "linen", x), got) <= tolerance()


def test_npz_of_a_state_dict_both_ways(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    model = zoo.create(CONFIG, "torch", seed=3).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    src = tmp_path / "weights.npz"
    np.savez(src, **{k: v.numpy() for k, v in model.state_dict().items()})
    det = detect(src)
    assert det.fmt == "npz" and "torch" not in det.reason
    code, _, err = cli(capsys, "convert", src, tmp_path / "o_linen", "--to", "linen", *ARCH)
    assert code == 0, err
    x = sample()
    got = forward(converters.load(tmp_path / "o_linen", "linen"), "linen", x)
    assert max_difference(forward(model, "torch", x), got) <= tolerance()
    back = tmp_path / "back.npz"
    code, _, err = cli(capsys, "convert", tmp_path / "o_linen", back, "--to", "npz")
    assert code == 0, err
    with np.load(back, allow_pickle=False) as npz:
        fresh = zoo.create(CONFIG, "torch", seed=9).eval()
        fresh.load_state_dict({k: torch.from_numpy(npz[k]) for k in npz.files}, strict=True)
    with torch.no_grad():
        np.testing.assert_array_equal(fresh(torch.from_numpy(x)).numpy(),
                                      model(torch.from_numpy(x)).numpy())  # same arrays


def test_npz_with_a_pickled_object_is_refused_naming_it(tmp_path, capsys):
    src = tmp_path / "objects.npz"
    np.savez(src, w=np.zeros(3, np.float32), meta=np.array([{"a": 1}], dtype=object))
    code, _, err = cli(capsys, "convert", src, tmp_path / "o.pt", "--to", "torch", *ARCH)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "'meta'" in err and "pickled objects are never loaded" in err


def test_npz_and_torch_zips_are_told_apart_by_content(tmp_path):
    torch = pytest.importorskip("torch")
    npz = tmp_path / "named_like_torch.pt"
    with open(npz, "wb") as f:
        np.savez(f, w=np.zeros(3, np.float32))
    with zipfile.ZipFile(npz) as z:
        assert z.namelist() == ["w.npy"]
    assert detect(npz).fmt == "npz"
    pt = tmp_path / "state.pt"
    torch.save({"w": torch.zeros(3)}, pt)
    assert detect(pt).fmt == "torch"
