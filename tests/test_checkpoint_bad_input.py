"""Bad checkpoints: each gives a clear error and exit code 1, never runs code, writes nothing."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

import zoo
from converters import Checkpoint, CheckpointError, ConversionError, read, write
from converters.__main__ import main
from converters.core import canonical_spec, from_canonical

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs the torch extra")
CFG = zoo.make_config("cnn", features=(4, 8), hidden=16, input_size=(8, 8))


def random_state(config: zoo.Config = CFG, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: (np.zeros((), np.int64) if np.issubdtype(s.dtype, np.integer)
                else rng.standard_normal(s.shape).astype(np.float32))
            for k, s in canonical_spec(config).items()}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("good")
    ck = Checkpoint(CFG, random_state())
    names = {"eqx": "m.eqx", "linen": "m_linen", "nnx": "m_nnx", "canonical": "m.safetensors",
             "torch": "m.pt" if HAVE_TORCH else "m_torch.safetensors"}
    return {fmt: write(ck, folder / name, fmt) for fmt, name in names.items()}


def digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted([path] if path.is_file() else path.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def fails(capsys, argv: list[str], *needles: str, code: int = 1) -> str:
    """Run the CLI, expect exit `code` (1: bad data or I/O, 2: bad arguments), an `error:` line
    containing every needle, and no DST."""
    before = {p: digest(Path(p)) for p in argv[1:2] if Path(p).exists()}
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith("error:"), err
    for needle in needles:
        assert needle in err, (needle, err)
    if argv[0] == "convert":
        dst = Path(argv[2])
        assert not dst.exists() and not Path(str(dst) + ".json").exists()
        if dst.parent.is_dir():
            assert not [p for p in dst.parent.iterdir() if p.name.startswith(".zoo-")]
    for p, d in before.items():
        assert digest(Path(p)) == d  # the source is untouched
    return err


def convert(src: Path, dst: Path, to: str = "nnx", *extra: str) -> list[str]:
    return ["convert", str(src), str(dst), "--to", to, *extra]


# --------------------------------------------------------------------------- damaged files
@pytest.mark.parametrize("fmt", ["eqx", "canonical", pytest.param("torch", marks=needs_torch)])
def test_truncated_files(fmt, sources, tmp_path, capsys):
    data = sources[fmt].read_bytes()
    for cut in (len(data) // 2, len(data) - 3, 20):
        bad = tmp_path / f"cut{cut}{sources[fmt].suffix}"
        bad.write_bytes(data[:cut])
        shutil.copy(str(sources[fmt]) + ".json", str(bad) + ".json") if fmt == "eqx" else None
        fails(capsys, convert(bad, tmp_path / "out_nnx"), str(bad))
        with pytest.raises((CheckpointError, ConversionError)):
            read(bad, config=CFG)


@pytest.mark.parametrize("fmt", ["eqx", "canonical", pytest.param("torch", marks=needs_torch)])
def test_corrupted_files(fmt, sources, tmp_path, capsys):
    data = bytearray(sources[fmt].read_bytes())
    bad = tmp_path / f"bad{sources[fmt].suffix}"
    if fmt == "eqx":  # garble the second .npy header
        second = data.index(b"\x93NUMPY", 10)
        data[second + 10:second + 40] = b"{'descr': '<f4', 'shape': ((("
    elif fmt == "canonical":  # garble the JSON header
        data[10:30] = b"#" * 20
    else:  # garble the zip's central directory
        data[-60:-20] = b"\x00" * 40
    bad.write_bytes(bytes(data))
    if fmt == "eqx":
        shutil.copy(str(sources[fmt]) + ".json", str(bad) + ".json")
    fails(capsys, convert(bad, tmp_path / "out.safetensors", "canonical"), "bad")


def test_empty_file_and_garbage(tmp_path, capsys):
    (tmp_path / "empty.pt").write_bytes(b"")
    fails(capsys, convert(tmp_path / "empty.pt", tmp_path / "o.eqx", "eqx"), "empty file")
    (tmp_path / "noise.bin2").write_bytes(bytes(range(7, 71)))
    fails(capsys, convert(tmp_path / "noise.bin2", tmp_path / "o.eqx", "eqx"),
          "cannot detect the format")
    fails(capsys, ["inspect", str(tmp_path / "empty.pt")], "empty file")
    fails(capsys, convert(tmp_path / "missing.pt", tmp_path / "o.eqx", "eqx"),
          "no such file", code=2)


def test_directory_that_is_not_a_checkpoint(sources, tmp_path, capsys):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hello")
    fails(capsys, convert(tmp_path / "plain", tmp_path / "o.eqx", "eqx"),
          "not an orbax checkpoint")
    broken = tmp_path / "broken_linen"
    shutil.copytree(sources["linen"], broken)
    for p in broken.rglob("*"):  # keep the markers, destroy the data
        if p.is_file() and p.name not in ("_CHECKPOINT_METADATA", "zoo.json"):
            p.write_bytes(b"\x00garbage")
    fails(capsys, convert(broken, tmp_path / "o.eqx", "eqx"), "broken_linen")


# --------------------------------------------------------------------------- wrong contents
@needs_torch
def test_wrong_architecture(sources, tmp_path, capsys):
    import torch

    torch.save(from_canonical(random_state(), CFG, "torch").state_dict(), tmp_path / "cnn.pt")
    err = fails(capsys, convert(tmp_path / "cnn.pt", tmp_path / "o_nnx", "nnx", "--arch", "mlp"),
                "cnn.pt: state does not fit mlp by name, and cannot match the source's layers",
                "unmatched target layer 'layers.0' (linear, shape (512, 784))",
                "fix: check --arch/--config (the layers or shapes differ)")
    assert "unmatched source layer 'convs.0' (conv, shape" in err
    # a checkpoint that carries its config refuses a contradicting one
    fails(capsys, convert(sources["eqx"], tmp_path / "o_nnx", "nnx", "--arch", "mlp"),
          "says it holds cnn")
    fails(capsys, convert(sources["nnx"], tmp_path / "o.eqx", "eqx", "--config",
                          json.dumps({**CFG.to_dict(), "hidden": 8})), "says it holds cnn")
    fails(capsys, convert(tmp_path / "cnn.pt", tmp_path / "o.eqx", "eqx", "--arch", "resnet9"),
          "unknown model 'resnet9': did you mean", code=2)


def test_missing_extra_misshaped_and_mistyped_keys(tmp_path, capsys):
    from safetensors.numpy import save_file

    state = random_state()
    del state["convs.1.bias"]
    state["head.weight"] = np.zeros((3,), np.float32)
    state["fc1.weight"] = np.zeros((16, 33), np.float32)
    state["bns.0.bias"] = state["bns.0.bias"].astype(np.float16)
    save_file(state, tmp_path / "bad.safetensors", metadata={"arch": "cnn",
                                                             "config": CFG.to_json()})
    fails(capsys, convert(tmp_path / "bad.safetensors", tmp_path / "o_linen", "linen"),
          "4 problem(s)", "missing key 'convs.1.bias' (expected shape (8,))",
          "unexpected key 'head.weight' (shape (3,))",
          "'fc1.weight': expected shape (16, 32), found (16, 33)",
          "'bns.0.bias': expected dtype float32, found float16")
    assert main(["inspect", str(tmp_path / "bad.safetensors")]) == 1
    assert "loads into the zoo: no" in capsys.readouterr().out


def test_misshaped_native_files_name_their_keys(sources, tmp_path, capsys):
    import equinox as eqx
    import orbax.checkpoint as ocp

    other = zoo.make_config("cnn", features=(4, 8), hidden=12, input_size=(8, 8))
    eqx.tree_serialise_leaves(tmp_path / "o.eqx", from_canonical(random_state(other), other,
                                                                 "eqx"))
    fails(capsys, convert(tmp_path / "o.eqx", tmp_path / "x.pt", "torch", "--config",
                          CFG.to_json()), ".fc1.weight: expected shape (16, 32) float32, found "
                          "(12, 32) float32")
    _, variables = from_canonical(random_state(other), other, "linen")
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "o_linen", variables)
    fails(capsys, convert(tmp_path / "o_linen", tmp_path / "x.pt", "torch", "--config",
                          CFG.to_json()), "'params.fc1.kernel': expected shape (32, 16), found "
                          "(32, 12)", "'params.fc2.kernel'")


# --------------------------------------------------------------------------- code execution
class Exploit:
    """Unpickling this would create a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@needs_torch
def test_pickles_that_would_run_code_are_refused(tmp_path, capsys):
    import torch

    marker = tmp_path / "pwned"
    torch.save({"convs.0.weight": Exploit(marker)}, tmp_path / "evil.pt")
    with open(tmp_path / "evil_legacy.pt", "wb") as f:
        pickle.dump({"convs.0.weight": Exploit(marker)}, f, protocol=2)
    assert not marker.exists()
    for name in ("evil.pt", "evil_legacy.pt"):
        fails(capsys, convert(tmp_path / name, tmp_path / "o.eqx", "eqx", "--arch", "cnn"),
              "refused by PyTorch's safe loader", "weights_only=True")
        fails(capsys, ["inspect", str(tmp_path / name)], "refused")
        assert not marker.exists()
    # a .npy record holding Python objects (a pickle) inside an Equinox file is refused too
    with open(tmp_path / "obj.eqx", "wb") as f:
        np.save(f, np.array([Exploit(marker)], dtype=object), allow_pickle=True)
    fails(capsys, convert(tmp_path / "obj.eqx", tmp_path / "o_nnx", "nnx", "--arch", "cnn"),
          "Python objects")
    assert not marker.exists()


# --------------------------------------------------------------------------- destinations
def test_unwritable_destination(sources, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        probe = locked / "probe"
        try:
            probe.write_text("x")
            probe.unlink()
            writable = True  # running as root: permissions do not stop us
        except OSError:
            writable = False
        if not writable:
            fails(capsys, convert(sources["eqx"], locked / "o_nnx", "nnx"), "cannot write")
            assert not list(locked.iterdir())
    finally:
        locked.chmod(0o700)
    # a parent that is a regular file stops everyone, root included
    (tmp_path / "file.txt").write_text("not a directory")
    for fmt, name in (("nnx", "o_nnx"), ("eqx", "o.eqx"), ("canonical", "o.safetensors")):
        fails(capsys, convert(sources["eqx"], tmp_path / "file.txt" / name, fmt),
              "not a directory")
    fails(capsys, convert(sources["eqx"], tmp_path / "nodir" / "o.eqx", "eqx"), "does not exist")


def test_refusals(sources, tmp_path, capsys):
    before = digest(sources["eqx"])
    assert main(convert(sources["eqx"], sources["eqx"], "eqx", "--force")) == 2
    assert "it is the source" in capsys.readouterr().err
    assert digest(sources["eqx"]) == before
    assert main(convert(sources["nnx"], sources["nnx"] / "x.eqx", "eqx")) == 2
    assert "inside the source" in capsys.readouterr().err
    assert not (sources["nnx"] / "x.eqx").exists()
    with pytest.raises(SystemExit) as e:
        main(convert(sources["eqx"], tmp_path / "o", "keras"))
    assert e.value.code == 2
    capsys.readouterr()
    fails(capsys, convert(sources["eqx"], tmp_path / "o.eqx", "eqx", "--config", "{broken"),
          "not valid JSON", code=2)


@needs_torch
def test_training_checkpoint_to_torch_needs_model_only(tmp_path, capsys):
    import optax

    model = from_canonical(random_state(), CFG, "nnx")
    params = zoo.interface("nnx").split(model)[1]
    src = tmp_path / "train_nnx"
    from converters import save

    save(model, src, "nnx", opt_state=optax.sgd(0.1, momentum=0.9).init(params), step=7)
    fails(capsys, convert(src, tmp_path / "o.pt", "torch"), "--model-only")
    assert main(convert(src, tmp_path / "o.pt", "torch", "--model-only")) == 0
    assert not read(tmp_path / "o.pt").training
