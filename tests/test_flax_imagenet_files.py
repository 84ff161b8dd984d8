"""The official Flax ImageNet example's saved files (`tests/flax_imagenet.py`): its variables
written with flax.serialization msgpack and with orbax, its `TrainState` written by
flax.training.checkpoints (orbax and msgpack), each converted by one command (no --map: the
nesting of the tree decides) and compared with the Flax model itself, run in eval mode with
every BatchNorm statistic perturbed (a mis-paired layer shows). Where the nesting does not
decide, the refusal names the candidates; a file of another named model gets a hint. The
padding the weights do not carry (Flax's SAME against PyTorch's) is said out loud."""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import jax
import numpy as np
import optax
import pytest
from flax import serialization
from flax.training import checkpoints

import converters
import zoo
from converters.matching.verify import forward, max_difference
from tests.converter_cli import cli
from tests.flax_imagenet import (
    BottleneckResNetBlock,
    ResNet,
    ResNetBlock,
    TrainState,
    random_variables,
)
from zoo.configs import PaddingWarning

torch = pytest.importorskip("torch")
SIZE = 32
SMALL = {"padding": "same", "widths": [8, 16, 32, 64], "stem_width": 8,
         "input_size": [SIZE, SIZE], "num_classes": 10}
RTOL = 1e-5  # max |a - b| / max |a| against the Flax model itself



def has_row(out: str, source: str, target: str) -> bool:
    row = re.compile(rf"(^|[\s│]){re.escape(source)}[\s│]+{re.escape(target)}([\s│]|$)")
    return any(row.search(line) for line in out.splitlines())


def evidence(out: str) -> set[str]:
    """The evidence the printed line names for the mapping, which it says it did not check."""
    found = re.search(r"not checked: the mapping \(evidence used: ([a-z, ]+);", out)
    assert found, out
    return set(found.group(1).split(", "))


def source_outputs(module, variables, size: int = SIZE) -> tuple[np.ndarray, np.ndarray]:
    """(x in the canonical layout, the Flax model's eval-mode outputs on it)."""
    x = np.random.default_rng(5).standard_normal((2, 3, size, size)).astype(np.float32)
    return x, np.asarray(module.apply(variables, x.transpose(0, 2, 3, 1), train=False))


def save_orbax(path, tree) -> None:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path.absolute(), tree)
        ckptr.wait_until_finished()


def save_train_state(tmp_path, module, variables, orbax: bool):
    """As the example's `train.py` saves: `checkpoints.save_checkpoint(workdir, state, step)`
    of its TrainState after a few Adam steps (its optimizer state non-trivial)."""
    import flax

    state = TrainState.create(apply_fn=module.apply, params=variables["params"],
                              tx=optax.adam(1e-3), batch_stats=variables["batch_stats"])
    state = state.apply_gradients(grads=jax.tree.map(np.ones_like, state.params))
    state = state.replace(params=variables["params"])
    old = flax.config.flax_use_orbax_checkpointing
    flax.config.update("flax_use_orbax_checkpointing", orbax)
    try:
        with warnings.catch_warnings():  # Flax announces its checkpointing's deprecation
            warnings.simplefilter("ignore", DeprecationWarning)
            return checkpoints.save_checkpoint(tmp_path / "workdir", state, step=1)
    finally:
        flax.config.update("flax_use_orbax_checkpointing", old)


def saved(tmp_path, how: str, module, variables):
    if how == "variables-msgpack":
        path = tmp_path / "variables.msgpack"
        path.write_bytes(serialization.to_bytes(variables))
        return path
    if how == "variables-orbax":
        save_orbax(tmp_path / "variables", variables)
        return tmp_path / "variables"
    return save_train_state(tmp_path, module, variables, orbax=how == "train-state-orbax")


def torchvision_style(path, config) -> np.ndarray:
    """The zoo's torch model loaded from the written `.pt` with PyTorch's own calls."""
    model = zoo.create(config, "torch", seed=9).eval()
    model.load_state_dict(torch.load(path, weights_only=True), strict=True)
    return model


# Both file formats in the quick subset; the training states (their extra entries are
# named by the same matching) in the full suite.
@pytest.mark.parametrize(("how", "to"), [
    ("variables-msgpack", "torch"), ("variables-orbax", "nnx"),
    pytest.param("train-state-orbax", "torch", marks=pytest.mark.full_only),
    pytest.param("train-state-msgpack", "nnx", marks=pytest.mark.full_only)])
def test_the_examples_files_convert_by_one_command(tmp_path, capsys, how, to):
    module = ResNet(stage_sizes=(2, 2, 2, 2), block_cls=ResNetBlock, num_classes=10,
                    num_filters=8)
    variables = random_variables(module, SIZE, seed=1)
    src = saved(tmp_path, how, module, variables)
    dst = tmp_path / ("out.pt" if to == "torch" else "out_nnx")
    code, out, err = cli(capsys, "convert", src, dst, "--to", to, "--arch", "resnet18",
                         "--config", json.dumps(SMALL))
    assert code == 0, err
    # the honest line: the layout checked, the mapping not, the evidence named
    assert "checked: the layout (the zoo's linen and" in out
    assert evidence(out) == {"shape", "nesting"}
    assert "the source model did not run, only a file was given" in out
    assert "verified" not in out
    # the pairs sorted names would get wrong: bn_init sorts after ResNetBlock_*
    assert has_row(out, "bn_init", "bn1") and has_row(out, "conv_init", "conv1")
    assert has_row(out, "ResNetBlock_2.norm_proj", "layer2.0.downsample.1")
    assert has_row(out, "ResNetBlock_2.BatchNorm_1", "layer2.0.bn2")
    if how.startswith("train-state"):
        assert "opt_state (optimizer state)" in out and "step (1)" in out
    x, ref = source_outputs(module, variables)
    model = (torchvision_style(dst, zoo.make_config("resnet18", **SMALL)) if to == "torch"
             else converters.load(dst, to))
    assert max_difference(ref, forward(model, to, x)) <= RTOL


@pytest.mark.full_only  # named models: a reference-model feature
def test_named_config_and_the_hint_for_another_one(tmp_path, capsys):
    """The example's ResNet-18 at its own widths and class count: `--arch resnet18-flax` (its
    padding) is all it takes; `--arch resnet34` fails on the shapes and names resnet18."""
    module = ResNet(stage_sizes=(2, 2, 2, 2), block_cls=ResNetBlock, num_classes=1000)
    variables = random_variables(module, SIZE, seed=2)
    src = tmp_path / "variables.msgpack"
    src.write_bytes(serialization.to_bytes(variables))
    config = json.dumps({"padding": "same", "input_size": [SIZE, SIZE]})
    code, _, err = cli(capsys, "convert", src, tmp_path / "wrong.pt", "--to", "torch",
                       "--arch", "resnet34", "--config", config)
    assert code == 1 and not (tmp_path / "wrong.pt").exists()
    lines = err.strip().splitlines()
    assert lines[1] == "hint: the file fits --arch resnet18", lines[:3]  # under the error line
    assert lines[-1].endswith("more lines (--debug shows them all)") and len(lines) == 14
    dst = tmp_path / "out.pt"  # the example's own named config pads as SAME
    code, out, err = cli(capsys, "convert", src, dst, "--to", "torch", "--arch",
                         "resnet18-flax", "--config", json.dumps({"input_size": [SIZE, SIZE]}))
    assert code == 0 and not err, err
    assert evidence(out) == {"shape", "nesting"}
    x, ref = source_outputs(module, variables)
    got = forward(torchvision_style(dst, zoo.make_config("resnet18-flax",
                                                         input_size=(SIZE, SIZE))), "torch", x)
    assert max_difference(ref, got) <= RTOL


def test_padding_the_weights_do_not_carry_is_said_out_loud(tmp_path, capsys):
    """The example's variables into a config padding as PyTorch convert (the weights fit),
    with one warning line naming the field and the flag, and the outputs are indeed another
    function's; with the example's SAME padding nothing is said. The Python API warns likewise
    (`PaddingWarning`); a PyTorch source, whose convolutions pad explicitly, is not warned."""
    module = ResNet(stage_sizes=(1, 1), block_cls=ResNetBlock, num_classes=5, num_filters=4)
    variables = random_variables(module, 16, seed=6)
    src = tmp_path / "variables.msgpack"
    src.write_bytes(serialization.to_bytes(variables))
    small = {"layers": [1, 1], "widths": [4, 8], "stem_width": 4, "input_size": [16, 16],
             "num_classes": 5}
    for padding in ("torch", "same"):
        dst = tmp_path / f"{padding}.pt"
        code, _, err = cli(capsys, "convert", src, dst, "--to", "torch", "--arch", "resnet",
                           "--config", json.dumps({**small, "padding": padding}))
        assert code == 0, err
        lines = err.strip().splitlines()
        if padding == "same":
            assert not lines, lines
            continue
        assert len(lines) == 1 and lines[0].startswith("warning: the source is a linen model"), \
            lines
        assert '("padding": "torch")' in lines[0]
        assert """pass --config '{"padding": "same"}'""" in lines[0]
    x, ref = source_outputs(module, variables, 16)
    outputs = {p: forward(converters.load(tmp_path / f"{p}.pt", "torch"), "torch", x)
               for p in ("torch", "same")}
    assert max_difference(ref, outputs["same"]) <= RTOL
    assert max_difference(ref, outputs["torch"]) > 100 * RTOL  # what the warning is about
    config = zoo.make_config("resnet", **small)
    with pytest.warns(PaddingWarning, match=r"""pass --config '\{"padding": "same"\}' """
                                            r"""\(padding="same" in Python\)"""):
        converters.import_state(variables, "linen", config)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PaddingWarning)
        converters.import_state(variables, "linen", zoo.make_config("resnet", **small,
                                                                    padding="same"))
        converters.import_state(zoo.create(config, "torch").state_dict(), "torch", config)


def test_undecided_pairs_are_named_never_guessed(tmp_path, capsys):
    """One Bottleneck block whose projection has the shapes of its last conv and norm: no
    other block shows which is which, so the refusal names both candidates, and the two
    --map rules it asks for convert it."""
    module = ResNet(stage_sizes=(1,), block_cls=BottleneckResNetBlock, num_classes=5,
                    num_filters=4)
    variables = random_variables(module, 16, seed=3)
    src = tmp_path / "variables.msgpack"
    src.write_bytes(serialization.to_bytes(variables))
    flags = ["--arch", "resnet", "--config", json.dumps(
        {"padding": "same", "block": "bottleneck", "layers": [1], "widths": [4],
         "stem_width": 4, "input_size": [16, 16], "num_classes": 5})]
    dst = tmp_path / "out.pt"
    code, _, err = cli(capsys, "convert", src, dst, "--to", "torch", *flags)
    assert code == 1 and not dst.exists()
    assert ("ambiguous: ['BottleneckResNetBlock_0.Conv_2', 'BottleneckResNetBlock_0.conv_proj']"
            " all fit ['layer1.0.conv3', 'layer1.0.downsample.0']") in err
    assert ("undecided: ['BottleneckResNetBlock_0.BatchNorm_2', "
            "'BottleneckResNetBlock_0.norm_proj'] fit ['layer1.0.bn3', "
            "'layer1.0.downsample.1'] alike") in err
    assert not re.search(r"--map '\S*(Conv_2|conv_proj|BatchNorm_2|norm_proj)=layer", err)
    block = r"BottleneckResNetBlock_0\."
    code, out, err = cli(capsys, "convert", src, dst, "--to", "torch", *flags,
                         "--map", f"{block}conv_proj=layer1.0.downsample.0",
                         "--map", f"{block}norm_proj=layer1.0.downsample.1")
    assert code == 0, err
    assert evidence(out) == {"shape", "map", "nesting"}
    x, ref = source_outputs(module, variables, 16)
    assert max_difference(ref, forward(converters.load(dst, "torch"), "torch", x)) <= RTOL


@pytest.mark.full_only  # named models: a reference-model feature
def test_a_state_dict_of_another_named_model_gets_the_hint(tmp_path, capsys):
    model = zoo.create("resnet20-cifar", "torch", seed=0)
    src = tmp_path / "r20.pt"
    torch.save(model.state_dict(), src)
    code, _, err = cli(capsys, "convert", src, tmp_path / "o.pt", "--to", "torch", "--arch",
                       "resnet")
    assert code == 1
    assert err.strip().splitlines()[1] == "hint: the file fits --arch resnet20-cifar"
    # a failure that is no mismatch of keys or shapes gets no hint
    code, _, err = cli(capsys, "convert", src, tmp_path / "o.pt", "--to", "torch", "--arch",
                       "resnet20-cifar", "--map", "([=x")
    assert code == 1 and "hint:" not in err


class EmaTrainState(TrainState):
    """A train state keeping an exponential moving average of the params beside them."""

    ema_params: Any = None


@pytest.mark.parametrize("how", [
    "variables-msgpack", pytest.param("train-state-orbax", marks=pytest.mark.full_only)])
def test_ema_params_follow_weights(tmp_path, capsys, how):
    """`ema_params` beside `params` is the EMA copy: `--weights ema` takes it, the default
    takes the live params and says so in the one note line."""
    module = ResNet(stage_sizes=(1, 1), block_cls=ResNetBlock, num_classes=5, num_filters=4)
    live, ema = (random_variables(module, 16, seed=s) for s in (4, 5))
    stats = live["batch_stats"]
    if how == "variables-msgpack":
        src = tmp_path / "ema.msgpack"
        src.write_bytes(serialization.to_bytes(
            {"params": live["params"], "ema_params": ema["params"], "batch_stats": stats}))
    else:
        import flax

        state = EmaTrainState.create(apply_fn=module.apply, params=live["params"],
                                     tx=optax.sgd(0.1), batch_stats=stats,
                                     ema_params=ema["params"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            src = checkpoints.save_checkpoint(tmp_path / "workdir", state, step=3)
        assert flax.config.flax_use_orbax_checkpointing
    flags = ["--arch", "resnet", "--config", json.dumps(
        {"padding": "same", "layers": [1, 1], "widths": [4, 8], "stem_width": 4,
         "input_size": [16, 16], "num_classes": 5})]
    for weights, params in ((None, live["params"]), ("ema", ema["params"])):
        dst = tmp_path / f"{weights}.pt"
        chosen = ["--weights", weights] if weights else []
        code, out, err = cli(capsys, "convert", src, dst, "--to", "torch", *flags, *chosen)
        assert code == 0, err
        note = next(line for line in out.splitlines() if line.startswith("  note:"))
        if weights is None:
            assert ("both live and EMA weights found: used the live ones (--weights ema takes "
                    "'ema_params')") in note
        else:
            assert "params from 'ema_params'" in note and "params (live weights)" in note
        x, ref = source_outputs(module, {"params": params, "batch_stats": stats}, 16)
        got = forward(converters.load(dst, "torch"), "torch", x)
        assert max_difference(ref, got) <= RTOL, weights
