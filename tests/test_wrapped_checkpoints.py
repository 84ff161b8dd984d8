"""Checkpoints as training code writes them: wrapped state_dicts (torchvision's reference
scripts, timm's CheckpointSaver, Lightning, DDP and torch.compile prefixes), live and EMA
weights, inert objects beside the tensors, hostile pickles. Each is built with random weights,
saved the way its source saves it, converted with the command line and compared with the
source model (eval mode, BatchNorm statistics perturbed), and loaded back into PyTorch with
``strict=True``."""

from __future__ import annotations

import argparse
import copy

import numpy as np
import pytest

import converters
import zoo
from converters.matching.verify import forward, max_difference, tolerance
from tests.converter_cli import cli

torch = pytest.importorskip("torch")

CONFIG = zoo.tiny_config("resnet")
ARCH = ("--arch", "resnet", "--config", CONFIG.to_json())



def source_model(seed: int):
    """The zoo's PyTorch ResNet with random weights and perturbed BatchNorm statistics, in
    eval mode."""
    model = zoo.create(CONFIG, "torch", seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))
    return model.eval()


def sample() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((2, *CONFIG.input_shape)).astype(np.float32)


def assert_reproduces(path, model, impl: str = "nnx") -> None:
    x = sample()
    got = forward(converters.load(path, impl), impl, x)
    assert max_difference(forward(model, "torch", x), got) <= tolerance()


def assert_loads_strict(path, model) -> None:
    """The converted .pt loads into a fresh copy of the source with strict key checking and
    reproduces it."""
    fresh = zoo.create(CONFIG, "torch", seed=99).eval()
    fresh.load_state_dict(torch.load(path, weights_only=True), strict=True)
    x = torch.from_numpy(sample())
    with torch.no_grad():
        np.testing.assert_array_equal(fresh(x).numpy(), model(x).numpy())  # same arrays


def sgd_state(model) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.from_numpy(sample())).sum().backward()
    opt.step()
    return opt.state_dict()


def test_torchvision_reference_script_checkpoint(tmp_path, capsys):
    """torchvision/references/classification/train.py: model, optimizer, scheduler, epoch,
    args (an argparse.Namespace) and model_ema (an AveragedModel: ``module.`` + n_averaged)."""
    model, shadow = source_model(0), source_model(1)
    ema = torch.optim.swa_utils.AveragedModel(shadow)
    args = argparse.Namespace(model="resnet", lr=0.1, output_dir=None)
    src = tmp_path / "checkpoint.pth"
    torch.save({"model": model.state_dict(), "optimizer": sgd_state(copy.deepcopy(model)),
                "lr_scheduler": {"last_epoch": 3}, "epoch": 3, "args": args,
                "model_ema": ema.state_dict()}, src)

    code, out, err = cli(capsys, "convert", src, tmp_path / "live_nnx", "--to", "nnx", *ARCH)
    assert code == 0, err
    note = next(line for line in out.splitlines() if "note: weights taken from 'model'" in line)
    assert "--weights ema takes 'model_ema'" in note
    for left in ("optimizer (optimizer state)", "epoch (3)", "args (Namespace)",
                 "model_ema (EMA weights)", "lr_scheduler"):
        assert left in note, (left, note)
    assert_reproduces(tmp_path / "live_nnx", model)

    code, out, err = cli(capsys, "convert", src, tmp_path / "ema_nnx", "--to", "nnx", *ARCH,
                         "--weights", "ema")
    assert code == 0, err
    assert "weights taken from 'model_ema'" in out and "model_ema/n_averaged" in out
    assert_reproduces(tmp_path / "ema_nnx", shadow)

    code, _, err = cli(capsys, "convert", src, tmp_path / "ema.pt", "--to", "torch", *ARCH,
                       "--weights", "ema")
    assert code == 0, err
    assert_loads_strict(tmp_path / "ema.pt", shadow)


def test_timm_checkpoint_saver(tmp_path, capsys):
    """timm's CheckpointSaver as timm's train.py uses it: state_dict, state_dict_ema,
    optimizer, args, epoch, metric."""
    from timm.utils import CheckpointSaver, ModelEmaV3

    model = source_model(2)
    ema = ModelEmaV3(model, decay=0.5)
    with torch.no_grad():
        for p in ema.module.parameters():
            p.mul_(0.5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    saver = CheckpointSaver(model, optimizer, args=argparse.Namespace(model="resnet"),
                            model_ema=ema, checkpoint_dir=str(tmp_path), recovery_dir=str(tmp_path),
                            max_history=1)
    saver.save_checkpoint(epoch=0, metric=0.5)
    src = tmp_path / "model_best.pth.tar"
    assert src.exists()

    code, out, err = cli(capsys, "convert", src, tmp_path / "live.pt", "--to", "torch", *ARCH)
    assert code == 0, err
    assert "weights taken from 'state_dict'" in out and "state_dict_ema (EMA weights)" in out
    assert "both live and EMA weights found: used the live ones" in out
    assert_loads_strict(tmp_path / "live.pt", model)

    ema_model = ema.module.eval()
    code, out, err = cli(capsys, "convert", src, tmp_path / "ema_linen", "--to", "linen", *ARCH,
                         "--weights", "ema")
    assert code == 0, err
    assert_reproduces(tmp_path / "ema_linen", ema_model, "linen")


def test_lightning_checkpoint_with_model_prefix(tmp_path, capsys):
    """A LightningModule holding the network as ``self.model``: Lightning's checkpoint keys."""
    model = source_model(3)
    src = tmp_path / "epoch=0-step=10.ckpt"
    torch.save({"epoch": 0, "global_step": 10, "pytorch-lightning_version": "2.4.0",
                "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "optimizer_states": [sgd_state(copy.deepcopy(model))], "lr_schedulers": [],
                "hyper_parameters": {"lr": 0.1}}, src)
    code, out, err = cli(capsys, "convert", src, tmp_path / "o.pt", "--to", "torch", *ARCH)
    assert code == 0, err
    assert "weights taken from 'state_dict'" in out and "optimizer_states (list)" in out
    assert "name ('model.' stripped)" in out
    assert_loads_strict(tmp_path / "o.pt", model)


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod."])
def test_ddp_and_compile_prefixes_need_no_matching(tmp_path, capsys, prefix):
    model = source_model(4)
    src = tmp_path / "wrapped.pt"
    torch.save({f"{prefix}{k}": v for k, v in model.state_dict().items()}, src)
    code, out, err = cli(capsys, "convert", src, tmp_path / "o_nnx", "--to", "nnx", *ARCH)
    assert code == 0, err
    assert "layer mapping" not in out  # the names are canonical once the wrapper is gone
    assert_reproduces(tmp_path / "o_nnx", model)


def test_weights_choice_refused_in_one_line(tmp_path, capsys):
    model = source_model(5)
    src = tmp_path / "ema_only.pt"
    torch.save({"state_dict_ema": model.state_dict(), "epoch": 1}, src)
    code, _, err = cli(capsys, "convert", src, tmp_path / "a.pt", "--to", "torch", *ARCH,
                       "--weights", "main")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "holds no live (non-EMA) weights, only EMA ones at ['state_dict_ema']" in err
    code, out, err = cli(capsys, "convert", src, tmp_path / "b.pt", "--to", "torch", *ARCH)
    assert code == 0, err
    assert "weights taken from 'state_dict_ema'" in out
    assert_loads_strict(tmp_path / "b.pt", model)
    plain = tmp_path / "plain.safetensors"
    converters.save(model, plain, "canonical", impl="torch")
    code, _, err = cli(capsys, "convert", plain, tmp_path / "c.pt", "--to", "torch",
                       "--weights", "ema")
    assert code == 2 and "holds one set of weights" in err and str(plain) in err


def test_two_unlabelled_copies_are_refused(tmp_path, capsys):
    state = source_model(6).state_dict()
    src = tmp_path / "twins.pt"
    torch.save({"a": state, "b": copy.deepcopy(state)}, src)
    code, _, err = cli(capsys, "convert", src, tmp_path / "o.pt", "--to", "torch", *ARCH)
    assert code == 1 and "2 copies of the model's weights at ['a', 'b']" in err


class Hostile:
    """Unpickling this would run a shell command."""

    def __reduce__(self):
        import os

        return os.system, ("touch HACKED",)


def test_hostile_pickle_beside_the_weights_is_refused_and_nothing_runs(tmp_path, capsys,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "hostile.pt"
    torch.save({"model": source_model(7).state_dict(), "args": argparse.Namespace(a=1),
                "payload": Hostile()}, src)
    before = set(torch.serialization.get_safe_globals())  # a set: its order is not stable
    code, _, err = cli(capsys, "convert", src, tmp_path / "o.pt", "--to", "torch", *ARCH)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "system" in err and "refused by PyTorch's safe loader" in err
    assert not (tmp_path / "HACKED").exists() and not (tmp_path / "o.pt").exists()
    assert set(torch.serialization.get_safe_globals()) == before  # never allowed globally


def test_inert_objects_beside_the_weights_are_read(tmp_path):
    import pathlib
    import types

    model = source_model(8)
    src = tmp_path / "with_objects.pt"
    torch.save({"state_dict": model.state_dict(), "out": pathlib.PurePosixPath("/runs/a"),
                "cfg": types.SimpleNamespace(lr=0.1), "args": argparse.Namespace(seed=0)}, src)
    ck = converters.load(src, arch="resnet", config=CONFIG.to_json())
    assert "left out: out (PurePosixPath), cfg (SimpleNamespace), args (Namespace)" in ck.notes[0]
    x = sample()
    got = forward(ck.model("eqx"), "eqx", x)
    assert max_difference(forward(model, "torch", x), got) <= tolerance()
