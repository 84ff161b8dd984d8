"""Every failure of the checkpoint CLI is one `error: ...` line naming the file, key or argument,
exit 1 (bad data or I/O) or 2 (bad arguments); tracebacks only with --debug."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import resource
import signal
from pathlib import Path

import numpy as np
import pytest

import zoo
from converters import Checkpoint, write
from converters.__main__ import main
from converters.core import canonical_spec

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs the torch extra")
MLP = zoo.tiny_config("mlp")
CNN = zoo.tiny_config("cnn")


def state_of(config: zoo.Config, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: (np.zeros((), np.int64) if np.issubdtype(s.dtype, np.integer)
                else rng.standard_normal(s.shape).astype(np.float32))
            for k, s in canonical_spec(config).items()}


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def one_error(code: int, err: str, want_code: int, *needles: str) -> None:
    assert code == want_code, (code, err)
    lines = err.strip().splitlines()
    assert lines and lines[0].startswith("error:"), err
    assert "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("src")
    ck = Checkpoint(CNN, state_of(CNN))
    return {"eqx": write(ck, d / "m.eqx", "eqx"), "nnx": write(ck, d / "m_nnx", "nnx"),
            "canonical": write(ck, d / "m.safetensors", "canonical"),
            "bare": write(Checkpoint(MLP, state_of(MLP)), d / "bare.safetensors", "torch"),
            "dir": d}


# --------------------------------------------------------------------------- configs
def test_bad_configs_are_usage_errors(files, tmp_path):
    bare = files["bare"]
    (tmp_path / "bin.json").write_bytes(bytes(range(256)))
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    cases = [("--config", tmp_path / "bin.json", "bin.json"),
             ("--config", tmp_path / "deep.json", "nested too deeply"),
             ("--config", json.dumps({"arch": "cnn", "dropout": "x"}), "CNNConfig.dropout"),
             ("--config", json.dumps({"arch": "cnn", "bn_eps": "x"}), "CNNConfig.bn_eps"),
             ("--config", json.dumps({"arch": "mlp", "hidden": [16, "8"]}), "MLPConfig.hidden"),
             ("--config", json.dumps({"arch": 5}), "'arch'"),
             ("--config", "[1, 2]", "neither a JSON object nor a file")]
    for flag, value, needle in cases:
        code, _, err = run("convert", bare, tmp_path / "o.eqx", "--to", "eqx", flag, value)
        one_error(code, err, 2, needle)
        assert not (tmp_path / "o.eqx").exists()


def _rewrite_sidecar(src: Path, dst: Path, **changes) -> Path:
    dst.write_bytes(src.read_bytes())
    meta = json.loads(Path(str(src) + ".json").read_text())
    for k, v in changes.items():
        if isinstance(v, dict) and isinstance(meta.get(k), dict):
            meta[k] = {**meta[k], **v}
        else:
            meta[k] = v
    Path(str(dst) + ".json").write_text(json.dumps(meta))
    return dst


def test_ill_typed_metadata_names_field_and_file(files, tmp_path):
    eqx_file = files["eqx"]
    nbt = "bns.0.num_batches_tracked"
    cases = [({"dtype": "float8"}, "'dtype'"), ({"dtype": 5}, "'dtype'"),
             ({"dtype": "object"}, "'dtype'"), ({"step": "abc"}, "'step'"),
             ({"num_batches_tracked": {nbt: "x"}}, nbt), ({"num_batches_tracked": {nbt: 10**30}},
                                                         nbt),
             ({"num_batches_tracked": {nbt: [1]}}, nbt), ({"config": [1]}, "'config'"),
             ({"config": {"dropout": "x"}}, "dropout"), ({"kind": 3}, "'kind'")]
    for i, (change, needle) in enumerate(cases):
        p = _rewrite_sidecar(eqx_file, tmp_path / f"b{i}.eqx", **change)
        for argv in (("inspect", p), ("convert", p, tmp_path / "o_nnx", "--to", "nnx")):
            code, _, err = run(*argv)
            one_error(code, err, 1, needle, p.name)
        assert not (tmp_path / "o_nnx").exists()


def test_safetensors_metadata_of_the_wrong_type(files, tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(files["canonical"]), "np") as f:
        meta, arrays = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    cases = [({"config": "[1, 2]"}, "'config'"), ({"config": '{"arch": "cnn", "hidden": "x"}'},
                                                  "hidden"),
             ({"step": "abc"}, "'step'"), ({"config": "{"}, "'config'"),
             ({"dtype": "float8"}, "'dtype'")]
    for i, (change, needle) in enumerate(cases):
        p = tmp_path / f"b{i}.safetensors"
        save_file(arrays, str(p), metadata={**meta, **change})
        for argv in (("inspect", p), ("convert", p, tmp_path / "o.eqx", "--to", "eqx")):
            code, _, err = run(*argv)
            one_error(code, err, 1, needle, p.name)
    # a __metadata__ that is not an object of strings (written by hand: the library refuses)
    header = json.dumps({"__metadata__": {"arch": 5}}).encode()
    p = tmp_path / "raw.safetensors"
    p.write_bytes(len(header).to_bytes(8, "little") + header)
    one_error(*run("inspect", p)[::2], 1, "__metadata__", p.name)


def test_inspect_fails_on_an_invalid_stored_config(files, tmp_path):
    p = _rewrite_sidecar(files["eqx"], tmp_path / "c.eqx", config={"hidden": -1})
    code, out, err = run("inspect", p)
    assert code == 1 and "loads into the zoo: no" in out and "stored config" in err, (out, err)


# --------------------------------------------------------------------------- torch tensors
@needs_torch
@pytest.mark.filterwarnings("ignore:Validating sparse tensor invariants")  # the sparse case
def test_torch_files_with_unsupported_tensors(tmp_path):
    import torch

    sd = {k: torch.from_numpy(v) for k, v in state_of(MLP).items()}
    cases = {"float8": {**sd, "layers.0.bias": sd["layers.0.bias"].to(torch.float8_e4m3fn)},
             "sparse": {**sd, "layers.0.weight": sd["layers.0.weight"].to_sparse()},
             "meta": {**sd, "layers.0.weight": torch.empty(16, 12, device="meta")}}
    for name, d in cases.items():
        torch.save(d, tmp_path / f"{name}.pt")
        code, _, err = run("convert", tmp_path / f"{name}.pt", tmp_path / "o.eqx", "--to", "eqx",
                           "--config", json.dumps(MLP.to_dict()))
        one_error(code, err, 1, f"{name}.pt", "'layers.0.")
        assert not (tmp_path / "o.eqx").exists()


# --------------------------------------------------------------------------- destinations
def test_dot_with_force_and_long_names(files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run("convert", files["eqx"], ".", "--to", "nnx", "--force")
    one_error(code, err, 1, "refusing to replace")
    name = "x" * 235
    code, _, err = run("convert", files["eqx"], name, "--to", "nnx")
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir()] == [name]


@pytest.mark.parametrize("fmt", ["eqx", "nnx", "canonical"])
def test_file_size_limit_during_a_write(files, tmp_path, fmt):
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2000, hard))
    try:
        code, _, err = run("convert", files["canonical"], tmp_path / "o", "--to", fmt)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    one_error(code, err, 1, "cannot write", str(tmp_path / "o"))
    assert list(tmp_path.iterdir()) == []  # no temporary directory left


def test_interrupt_during_an_nnx_write_leaves_nothing(files, tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    save = ocp.Checkpointer.save

    def interrupted(*args, **kwargs):
        save(*args, **kwargs)  # the arrays are written, the checkpoint not yet published
        raise KeyboardInterrupt

    monkeypatch.setattr(ocp.Checkpointer, "save", interrupted)
    code, _, err = run("convert", files["eqx"], tmp_path / "o_nnx", "--to", "nnx")
    assert code == 130 and err.strip() == "interrupted: nothing was written", err
    assert list(tmp_path.iterdir()) == []


def test_damaged_orbax_metadata_is_one_line(files, tmp_path):
    import shutil

    d = tmp_path / "d_nnx"
    shutil.copytree(files["nnx"], d)
    members = [p for p in d.rglob("*") if p.is_file() and "array_metadatas" in str(p)]
    members = members or [p for p in d.rglob("*") if p.is_file() and p.name != "zoo.json"]
    for p in members:
        p.write_bytes(b"\x00garbage" * 3)
    code, _, err = run("convert", d, tmp_path / "o.eqx", "--to", "eqx")
    one_error(code, err, 1, "d_nnx")
    assert "Event loop is closed" not in err



@pytest.mark.full_only  # fresh interpreters or files: the quick subset's budget
def test_a_damaged_orbax_checkpoint_leaves_nothing_behind(files, tmp_path, monkeypatch):
    """Orbax abandons its reads in flight when one fails: their reports ("Event loop is
    closed", errors of collected coroutines) must not surface later, in unrelated code."""
    import gc
    import shutil
    import sys
    import time

    from converters import CheckpointError, read

    reports: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reports.append(repr(u.exc_value)))
    for i in range(3):
        d = tmp_path / f"d{i}_nnx"
        shutil.copytree(files["nnx"], d)
        for p in d.rglob("*"):
            if p.is_file() and p.name != "zoo.json" and "metadata" not in p.name.lower():
                p.write_bytes(b"\x00garbage" * 3)
        with pytest.raises(CheckpointError, match=f"d{i}_nnx"):
            read(d)
    time.sleep(0.3)
    gc.collect()
    assert reports == []

def test_debug_shows_the_traceback(files, tmp_path):
    (tmp_path / "e.pt").write_bytes(b"")
    with pytest.raises(Exception, match="empty file"):
        run("inspect", tmp_path / "e.pt", "--debug")
