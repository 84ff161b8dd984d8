"""Checkpoints never lose or misread a file: one test per way they once did.

Hangs on hostile shapes, a source destroyed by how its path is spelled, unrelated directories
replaced, the tool's own files misdetected, silent dtype changes, mixed precision accepted then
unreadable, corrupted zips accepted, and the state a crash or a concurrent writer leaves.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import signal
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import zoo
from converters import Checkpoint, CheckpointError, ConversionError, detect, read, write
from converters.__main__ import main
from converters.core import canonical_spec

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs the torch extra")
MLP = zoo.tiny_config("mlp")  # 12-16-8-5
CNN = zoo.tiny_config("cnn")
MLP_JSON = json.dumps(MLP.to_dict())


def state_of(config: zoo.Config, dtype: str = "float32", seed: int = 0) -> dict:
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(seed)
    return {k: (np.zeros((), np.int64) if np.issubdtype(s.dtype, np.integer)
                else rng.standard_normal(s.shape).astype(dt))
            for k, s in canonical_spec(config).items()}


def tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted([path] if path.is_file() else path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path.parent)).encode() + p.read_bytes())
    return h.hexdigest()


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _env() -> dict[str, str]:
    """The environment of a child process that runs the code under test."""
    import converters

    root = Path(converters.__file__).resolve().parents[1]
    return {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}


def npy_record(descr: str, shape: tuple[int, ...]) -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


# --------------------------------------------------------------------------- 1: no hang
def test_overflowing_npy_shape_fails_fast_instead_of_hanging(tmp_path):
    p = tmp_path / "evil.eqx"
    p.write_bytes(npy_record("|u1", (128, (2**64 - 128) // 128)))
    assert p.stat().st_size == 128
    # in a child process with a time limit: a hang must fail the test, not stall the suite
    code = ("import sys; from converters.__main__ import main; "
            f"sys.exit(main(['inspect', {str(p)!r}]) * 10 + main(['convert', {str(p)!r}, "
            f"{str(tmp_path / 'o_nnx')!r}, '--to', 'nnx', '--arch', 'mlp']))")
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 11, done.stderr
    assert done.stderr.count("error:") == 2 and "evil.eqx" in done.stderr, done.stderr
    assert not (tmp_path / "o_nnx").exists()
    p.write_bytes(npy_record("<f4", (3, -2)))
    code, _, err = run(["inspect", p])
    assert code == 1 and "evil.eqx" in err and "invalid shape" in err, err


# --------------------------------------------------------------------------- 2: the source
@pytest.fixture
def run_dir(tmp_path):
    run_ = tmp_path / "run"
    (run_ / "sub").mkdir(parents=True)
    ck = Checkpoint(MLP, state_of(MLP))
    return run_, write(ck, run_ / "m_nnx", "nnx"), write(ck, run_ / "m.eqx", "eqx")


def test_destination_inside_the_source_is_refused_however_spelled(run_dir, monkeypatch):
    run_, nnx, _ = run_dir
    before = tree_digest(nnx)
    monkeypatch.chdir(run_ / "sub")
    code, _, err = run(["convert", "../m_nnx", run_ / "m_nnx" / "x.eqx", "--to", "eqx"])
    assert code == 2 and "inside the source" in err, err
    assert tree_digest(nnx) == before


def test_destination_equal_to_the_source_is_refused_even_with_force(run_dir, monkeypatch):
    run_, nnx, eqx_file = run_dir
    before = {p: tree_digest(p) for p in (nnx, eqx_file)}
    monkeypatch.chdir(run_)
    code, _, err = run(["convert", "m.eqx", "sub/../m.eqx", "--to", "canonical", "--force"])
    assert code == 2 and "is the source" in err, err
    (run_ / "link").symlink_to(".")
    code, _, err = run(["convert", "m_nnx", "link/m_nnx", "--to", "linen", "--force"])
    assert code == 2 and "is the source" in err, err
    code, _, err = run(["convert", "m_nnx", ".", "--to", "eqx", "--force"])
    assert code == 2 and "contains the source" in err, err
    assert {p: tree_digest(p) for p in before} == before
    assert read(nnx).source.fmt == "nnx"


# --------------------------------------------------------------------------- 3: not ours
def test_force_never_replaces_what_is_not_a_checkpoint(run_dir):
    run_, _, eqx_file = run_dir
    thesis = run_ / "thesis"
    (thesis / "chapter").mkdir(parents=True)
    (thesis / "thesis.txt").write_text("years of work")
    notes = run_ / "notes.eqx"
    notes.write_text("not a checkpoint")
    for dst, to in ((thesis, "nnx"), (notes, "eqx")):
        before = tree_digest(dst)
        code, _, err = run(["convert", eqx_file, dst, "--to", to, "--force"])
        assert code == 1 and "refusing to replace" in err and str(dst) in err, err
        assert tree_digest(dst) == before
    # a checkpoint of a known format is replaced, with its sidecar
    code, _, err = run(["convert", eqx_file, run_ / "m_nnx", "--to", "eqx", "--force"])
    assert code == 0, err
    assert read(run_ / "m_nnx").source.fmt == "eqx"


# --------------------------------------------------------------------------- 4: detection
def _pad_header(data: bytes, low_byte: int) -> bytes:
    """The same safetensors file with its header padded by spaces (as the format allows) to a
    length whose low byte is `low_byte`."""
    n = int.from_bytes(data[:8], "little")
    pad = (low_byte - n) % 256
    header = data[8:8 + n] + b" " * pad
    return len(header).to_bytes(8, "little") + header + data[8 + n:]


def test_own_safetensors_files_are_detected_for_every_low_byte_of_the_header_length(tmp_path):
    base = write(Checkpoint(MLP, state_of(MLP, "float16")), tmp_path / "m.safetensors",
                 "canonical").read_bytes()
    want = read(tmp_path / "m.safetensors").state
    p = tmp_path / "p.safetensors"
    for low in range(256):
        p.write_bytes(_pad_header(base, low))
        assert int.from_bytes(p.read_bytes()[:8], "little") % 256 == low
        assert detect(p).fmt == "canonical", low
        if low in (0x80, 0x93, 0x50, 0):  # the magics of pickle, .npy, zip
            got = read(p).state
            assert all(got[k].tobytes() == want[k].tobytes() for k in want)


def test_float16_mlp_and_training_checkpoint_read_back(tmp_path):
    import optax

    import converters

    for seed in range(6):  # header lengths vary with the values' digits: cover several
        p = write(Checkpoint(MLP, state_of(MLP, "float16", seed)), tmp_path / f"{seed}.safetensors",
                  "canonical")
        code, out, err = run(["inspect", p])
        assert code == 0 and "architecture: mlp" in out, (out, err)
    tx = optax.adam(1e-3)
    for step in (0, 7, 128, 12345):
        model = zoo.create(MLP, "nnx")
        params = zoo.interface("nnx").split(model)[1]
        p = converters.save(model, tmp_path / f"t{step}.safetensors", "canonical",
                            opt_state=tx.init(params), step=step)
        ck = read(p)
        assert ck.step == step and ck.optimizer is not None


# --------------------------------------------------------------------------- 5, 6: dtypes
@needs_torch
def test_float64_is_refused_without_an_explicit_cast(tmp_path):
    import torch

    sd = {k: torch.from_numpy(v.astype(np.float64) if v.dtype == np.float32 else v)
          for k, v in state_of(MLP).items()}
    torch.save(sd, tmp_path / "f64.pt")
    for fmt, name in (("eqx", "o.eqx"), ("linen", "o_linen"), ("nnx", "o_nnx")):
        code, _, err = run(["convert", tmp_path / "f64.pt", tmp_path / name, "--to", fmt,
                            "--config", MLP_JSON])
        assert code == 1 and "float64" in err and "--cast float32" in err, err
        assert not (tmp_path / name).exists()
    code, _, err = run(["convert", tmp_path / "f64.pt", tmp_path / "o.eqx", "--to", "eqx",
                          "--config", MLP_JSON, "--cast", "float32"])
    assert code == 0, err
    ck = read(tmp_path / "o.eqx")
    assert ck.dtype == np.float32
    assert json.loads((tmp_path / "o.eqx.json").read_text())["dtype"] == "float32"
    np.testing.assert_array_equal(ck.state["layers.0.weight"],
                                  sd["layers.0.weight"].numpy().astype(np.float32))
    # a format that holds float64 keeps it, exactly
    code, _, err = run(["convert", tmp_path / "f64.pt", tmp_path / "o.safetensors", "--to",
                        "canonical", "--config", MLP_JSON])
    assert code == 0 and read(tmp_path / "o.safetensors").dtype == np.float64, err


@needs_torch
def test_low_precision_parameters_with_float32_statistics(tmp_path):
    import ml_dtypes
    import torch

    st = state_of(CNN, "bfloat16")
    for k in st:
        if k.endswith(("running_mean", "running_var")):
            st[k] = st[k].astype(np.float32)
    torch.save({k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16)
                if v.dtype == ml_dtypes.bfloat16 else torch.from_numpy(v) for k, v in st.items()},
               tmp_path / "mixed.pt")
    for fmt in ("eqx", "linen", "nnx"):
        code, _, err = run(["convert", tmp_path / "mixed.pt", tmp_path / f"o_{fmt}", "--to", fmt,
                            "--arch", "cnn", "--config", json.dumps(CNN.to_dict())])
        assert code == 1 and "mixes floating dtypes" in err and "running_mean" in err, err
        assert not (tmp_path / f"o_{fmt}").exists()
        code, _, err = run(["convert", tmp_path / "mixed.pt", tmp_path / f"o_{fmt}", "--to", fmt,
                            "--config", json.dumps(CNN.to_dict()), "--cast", "bfloat16"])
        assert code == 0, err
        code, out, err = run(["inspect", tmp_path / f"o_{fmt}"])
        assert code == 0 and "loads into the zoo: yes" in out, (out, err)
        assert read(tmp_path / f"o_{fmt}").dtype == ml_dtypes.bfloat16


def test_invalid_optimizer_layout_in_metadata_is_refused_naming_the_file(tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import save_file

    import converters

    model = zoo.create(MLP, "nnx")
    params = zoo.interface("nnx").split(model)[1]
    import optax

    p = converters.save(model, tmp_path / "t.safetensors", "canonical",
                        opt_state=optax.adam(1e-3).init(params), step=1)
    with safe_open(str(p), "np") as f:
        meta, arrays = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    for bad in ([{"__leaf__": "array", "shape": "x", "dtype": "float32"}],
                [{"__leaf__": "tensor"}], [{"__empty__": "set"}], 5):
        q = tmp_path / "bad.safetensors"
        save_file(arrays, str(q), metadata={**meta, "optimizer": json.dumps(bad)})
        for argv in (["inspect", q], ["convert", q, tmp_path / "o.eqx", "--to", "eqx"]):
            code, _, err = run(argv)
            assert code == 1 and "bad.safetensors" in err and "optimizer" in err, (bad, err)
        assert not (tmp_path / "o.eqx").exists()


# --------------------------------------------------------------------------- 7: CRC
@needs_torch
def test_corrupted_torch_zip_is_refused_by_its_crc(tmp_path):
    import torch

    torch.save({k: torch.from_numpy(v) for k, v in state_of(MLP).items()}, tmp_path / "m.pt")
    data = bytearray((tmp_path / "m.pt").read_bytes())
    with zipfile.ZipFile(tmp_path / "m.pt") as z:
        infos = {i.filename.split("/", 1)[1]: i for i in z.infolist()}
    for member in ("data/0", "data.pkl"):
        info = infos[member]
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
        bad = bytearray(data)
        bad[start + info.compress_size // 2] ^= 0x04  # one bit of the payload / the pickle
        (tmp_path / "bad.pt").write_bytes(bytes(bad))
        code, _, err = run(["convert", tmp_path / "bad.pt", tmp_path / "o.eqx", "--to", "eqx",
                            "--config", MLP_JSON])
        assert code == 1 and "CRC-32" in err and "bad.pt" in err, (member, err)
        assert not (tmp_path / "o.eqx").exists()


@needs_torch
def test_torch_zip_checked_by_its_sidecar_digest_or_its_crc(tmp_path, monkeypatch):
    """A `.pt` whose SHA-256 matches its sidecar is the file as written: no CRC-32 pass. One
    changed after (its sidecar stale) is checked member by member, and refused."""
    out = write(Checkpoint(MLP, state_of(MLP)), tmp_path / "m.pt", "torch")
    tested = []
    testzip = zipfile.ZipFile.testzip
    monkeypatch.setattr(zipfile.ZipFile, "testzip",
                        lambda z: (tested.append(z.filename), testzip(z))[1])
    assert read(out).config == MLP and tested == []
    with zipfile.ZipFile(out) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("data/0"))
    data = bytearray(out.read_bytes())
    names, extra = struct.unpack_from("<HH", data, info.header_offset + 26)  # local header
    data[info.header_offset + 30 + names + extra + 3] ^= 0x04  # a bit of the first tensor
    out.write_bytes(bytes(data))
    code, _, err = run(["convert", out, tmp_path / "o.eqx", "--to", "eqx", "--config",
                        MLP_JSON])
    assert code == 1 and "CRC-32" in err and tested == [str(out)], err


# --------------------------------------------------------------------------- 8: crash, race
WRAPPER = """
import os, signal, sys, time
mode, n = sys.argv[1], int(sys.argv[2])
calls = [0]
def hooked(fn):
    def wrapper(*a, **k):
        calls[0] += 1
        if mode == "kill" and calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "slow":
            time.sleep(n / 10)
        return fn(*a, **k)
    return wrapper
os.replace = hooked(os.replace)
if mode == "kill":
    os.mkdir, os.unlink = hooked(os.mkdir), hooked(os.unlink)
from converters.__main__ import main
sys.exit(main(sys.argv[3:]))
"""


def _spawn(tmp_path: Path, mode: str, n: int, *argv) -> subprocess.Popen:
    script = tmp_path / "wrapper.py"
    script.write_text(WRAPPER)
    return subprocess.Popen([sys.executable, str(script), mode, str(n), *map(str, argv)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ours(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".zoo-"))


@pytest.mark.full_only
def test_a_kill_at_any_point_leaves_the_old_or_the_new_checkpoint(tmp_path):
    old, new = Checkpoint(MLP, state_of(MLP, seed=1)), Checkpoint(MLP, state_of(MLP, seed=2))
    src = write(new, tmp_path / "src.safetensors", "canonical")
    # kill at the n-th os.mkdir / os.replace / os.unlink: for eqx 1 is the temporary directory,
    # 2 the data's rename and 3 the sidecar's; for nnx orbax's own calls come in between
    cases = [("eqx", 3, False), ("eqx", 3, True), ("nnx", 1, True), ("nnx", 3, True)]
    dsts = {}
    for fmt, n, existing in cases:
        d = tmp_path / f"{fmt}{n}{'x' if existing else ''}" / ("m.eqx" if fmt == "eqx" else "m")
        d.parent.mkdir()
        if existing:
            write(old, d, fmt)
        dsts[fmt, n, existing] = d
    procs = {}
    for key, d in dsts.items():  # two at a time: the machine may have two cores
        procs[key] = _spawn(tmp_path, "kill", key[1], "convert", src, d, "--to", key[0],
                            "--force")
        if len(procs) % 2 == 0:
            [p.communicate(timeout=120) for p in list(procs.values())[-2:]]
    [p.communicate(timeout=120) for p in procs.values() if p.returncode is None]
    assert all(p.returncode == -signal.SIGKILL for p in procs.values()), {
        k: p.returncode for k, p in procs.items()}
    for (fmt, n, existing), d in dsts.items():
        if d.exists():  # the old or the new checkpoint, complete, with its metadata
            got = read(d).state
            assert any(all(got[k].tobytes() == c.state[k].tobytes() for k in got)
                       for c in (old, new)), (fmt, n, existing)
        else:
            assert not existing or _ours(d.parent), (fmt, n)  # the old one is kept aside
        # the next run is never blocked, cleans up and completes
        code, _, err = run(["convert", src, d, "--to", fmt, "--force"])
        assert code == 0, (fmt, n, existing, err)
        got = read(d)
        assert got.source.note == "" and all(
            got.state[k].tobytes() == new.state[k].tobytes() for k in new.state)
        assert _ours(d.parent) == [], (fmt, n, existing)


@pytest.mark.full_only  # fresh interpreters or files: the quick subset's budget
def test_orphan_sidecar_of_ours_never_blocks_a_write(tmp_path):
    ck = Checkpoint(MLP, state_of(MLP))
    p = write(ck, tmp_path / "m.eqx", "eqx")
    p.unlink()  # as a kill between removing data and sidecar once left it
    assert (tmp_path / "m.eqx.json").exists()
    src = write(ck, tmp_path / "s.safetensors", "canonical")
    code, _, err = run(["convert", src, p, "--to", "eqx"])
    assert code == 0, err
    # a stale sidecar (describing other data) is ignored with a note, then replaced
    (tmp_path / "m.eqx.json").write_text((tmp_path / "m.eqx.json").read_text().replace(
        '"sha256": "', '"sha256": "0'))
    code, out, err = run(["inspect", p])
    assert "describes other data" in out, out
    code, _, err = run(["convert", tmp_path / "s.safetensors", p, "--to", "eqx", "--force"])
    assert code == 0 and read(p).source.note == "", err


@pytest.mark.full_only
def test_two_concurrent_writers_never_mix_their_outputs(tmp_path):
    a = write(Checkpoint(MLP, state_of(MLP, seed=1)), tmp_path / "a.safetensors", "canonical")
    b = write(Checkpoint(MLP, state_of(MLP, seed=2)), tmp_path / "b.safetensors", "canonical")
    dst = tmp_path / "out.eqx"
    procs = [_spawn(tmp_path, "slow", 5, "convert", s, dst, "--to", "eqx", "--force")
             for s in (a, b)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(c for c, _ in results)
    assert codes in ([0, 0], [0, 1]), results
    if codes == [0, 1]:
        assert any("another process is writing" in e for _, e in results), results
    got = read(dst)
    assert got.source.note == ""  # the sidecar describes exactly this data
    want = [read(s).state for s in (a, b)]
    assert any(all(got.state[k].tobytes() == w[k].tobytes() for k in w) for w in want)
    assert _ours(tmp_path) == []


def test_long_destination_names_fit_the_temporaries(tmp_path):
    ck = Checkpoint(MLP, state_of(MLP))
    for fmt, name in (("canonical", "n" * 235 + ".safetensors"), ("nnx", "d" * 250)):
        p = write(ck, tmp_path / name, fmt)
        assert read(p).state.keys() == ck.state.keys()


def test_api_refuses_the_same_rules(run_dir):
    import converters

    run_, nnx, eqx_file = run_dir
    with pytest.raises(CheckpointError, match="inside the source"):
        converters.convert_file(nnx, run_ / "sub" / ".." / "m_nnx" / "x.eqx", "eqx")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        (run_ / "junk").mkdir()
        (run_ / "junk" / "a.txt").write_text("a")
        converters.convert_file(eqx_file, run_ / "junk", "nnx", force=True)
    with pytest.raises(ConversionError):
        write(Checkpoint(MLP, {**state_of(MLP), "layers.0.weight": np.zeros(3, np.float32)}),
              run_ / "x.eqx", "eqx")
    assert (run_ / "junk" / "a.txt").read_text() == "a"
