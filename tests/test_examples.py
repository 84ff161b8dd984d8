"""The checkpoint examples run end to end with small settings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ELEMENTAL_EMITTER
from zoo.runtime import precision

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str, tmpdir: Path | None = None) -> str:
    env = None if tmpdir is None else {**os.environ, "TMPDIR": str(tmpdir)}
    done = subprocess.run([sys.executable, f"examples/{name}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def optimized(env: dict[str, str]) -> dict[str, str]:
    """`env` without the suite's compile-time settings (tests/conftest.py): for an example
    whose running time outweighs its compiling (the ResNet's evaluation on 360 images took
    8.7 s unoptimised, 2.0 s optimised; the whole example 24 s against 16 s)."""
    flags = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f != ELEMENTAL_EMITTER)
    return {**{k: v for k, v in env.items() if k != "JAX_DISABLE_MOST_OPTIMIZATIONS"},
            "XLA_FLAGS": flags}


def test_port_torch_checkpoint(tmp_path):
    pytest.importorskip("torch")
    out = run_example("port_torch_checkpoint.py", "--arch", "cnn", "--batch", "4",
                      "--out-dir", str(tmp_path))
    diffs = [float(d) for d in re.findall(r"max abs difference ([0-9.e+-]+)", out)]
    assert len(diffs) == 2 and max(diffs) < precision.tolerance("float32", kind="max_relative"), out
    assert "OK" in out
    assert (tmp_path / "model.pt").is_file() and (tmp_path / "model_nnx").is_dir()
    assert (tmp_path / "model.eqx").is_file() and (tmp_path / "model.eqx.json").is_file()


def test_switch_library_mid_training(tmp_path):
    out = run_example("switch_library_mid_training.py", "--steps", "8", "--batch-size", "32",
                      "--out-dir", str(tmp_path))
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out)]
    assert len(losses) == 8, out
    assert "[  eqx] step    4" in out and "[linen] step    5" in out
    # The claim: the checkpoint computes the same in both libraries.
    switched = re.search(r"switched at step 4: .* \(test accuracy ([0-9.]+) in Equinox, "
                         r"([0-9.]+) in Linen\)", out)
    assert switched and switched[1] == switched[2], out
    png = tmp_path / "switch_library_mid_training.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "digits_step_linen" / "zoo.json").is_file()


def test_bring_your_own_checkpoint(tmp_path):
    """Without --out-dir (the other examples' tests give one) it works in a temporary folder
    and removes it."""
    pytest.importorskip("torch")
    out = run_example("bring_your_own_checkpoint.py", tmpdir=tmp_path)
    assert "Conv_0" in out and "Dense_1" in out and "checked: the layout (the zoo's" in out
    assert "not checked: the mapping (evidence used: shape;" in out
    diffs = [float(d) for d in re.findall(r"max relative difference ([0-9.e+-]+)", out)]
    assert len(diffs) == 4 and max(diffs) < precision.tolerance("float32", kind="max_relative")
    assert "OK" in out.splitlines() and "cnn.pt" in out
    assert "temporary folder, now removed" in out and list(tmp_path.iterdir()) == []


def test_examples_without_scikit_learn_fail_in_one_line():
    """Each example that needs scikit-learn says so in one line and exits 1 (both run in one
    interpreter: the check is each example's own, the interpreter's start is shared)."""
    code = ("import sys, runpy; sys.modules['sklearn'] = None\n"
            "for name in ('switch_library_mid_training.py', 'finetune_resnet.py'):\n"
            "    sys.argv = [name]\n"
            "    try:\n"
            "        runpy.run_path(f'examples/{name}', run_name='__main__')\n"
            "    except SystemExit as e:\n"
            "        print(name, e.code)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["switch_library_mid_training.py 1",
                                        "finetune_resnet.py 1"]
    assert done.stderr.strip().splitlines() == [
        'switch_library_mid_training.py: needs scikit-learn: pip install -e ".[examples]"',
        'finetune_resnet.py: needs scikit-learn: pip install -e ".[torch,examples]"']


def test_finetune_resnet(tmp_path):
    """A torchvision ResNet-18 checkpoint gets a new 10-class head in NNX, is fine-tuned on the
    digits, evaluated and written back: torchvision loads it strictly with the same outputs;
    the default temporary folder is removed."""
    pytest.importorskip("torchvision")
    pytest.importorskip("sklearn")
    done = subprocess.run([sys.executable, "examples/finetune_resnet.py", "--steps", "2",
                           "--batch-size", "16"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=optimized({**os.environ, "TMPDIR": str(tmp_path)}))
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "re-initialised fc for 10 classes (the checkpoint has 1000)" in out
    assert re.search(r"fine-tuning .* 2/2 loss \d+\.\d+", out), out
    # The accuracy of 2 steps claims nothing; the example's claim is the logits' agreement.
    assert "loads it with strict=True" in out and out.rstrip().splitlines()[-2] == "OK"
    diff = float(re.search(r"max relative difference ([0-9.e+-]+)", out).group(1))
    assert diff < precision.tolerance("float32", kind="max_relative")
    assert "temporary folder, now removed" in out and list(tmp_path.iterdir()) == []


def test_generate_with_tiny_gpt2(tmp_path):
    """A few training steps: the tokenizer, the training, the conversions, the Hugging Face
    folder and the same continuation in every library and `transformers`."""
    for package in ("torch", "transformers", "tokenizers"):
        pytest.importorskip(package)
    out = run_example("generate_with_tiny_gpt2.py", "--steps", "3", "--vocab", "300",
                      "--new-tokens", "6", "--impl", "linen", "--out-dir", str(tmp_path / "out"))
    assert "trained 3 steps in linen" in out and "linen continues" in out
    assert "same 6 tokens in eqx, linen, nnx, torch, transformers: OK" in out, out
    folder = tmp_path / "out" / "tiny-gpt2-hf"  # --out-dir made where it was missing
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()


def test_lora_finetune(tmp_path):
    """A few steps of the base and of LoRA, the adapter through peft's files, the same
    continuation in every library and transformers + peft."""
    for package in ("torch", "transformers", "tokenizers", "peft"):
        pytest.importorskip(package)
    out = run_example("lora_finetune.py", "--base-steps", "2", "--steps", "2", "--vocab",
                      "300", "--new-tokens", "6", "--impl", "eqx", "--out-dir", str(tmp_path / "o"))
    assert "LoRA fine-tuning: 2 steps in eqx" in out, out
    assert "same 6 tokens in eqx, linen, nnx, torch, transformers+peft: OK" in out, out
    assert (tmp_path / "o" / "adapter" / "adapter_config.json").is_file()  # dir made
