"""Fuzzed checkpoint CLI: random bytes, truncations and bit flips of real checkpoints of every
format, random metadata and random DST spellings (``..``, symlinks).

Invariants on every example: exit status in {0, 1, 2}; a failure is one ``error:`` line and no
traceback; the run ends (a watchdog catches a hang); the source is unchanged; DST is absent,
unchanged or a complete checkpoint that loads; nothing else in the directory is touched.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import importlib.util
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

import zoo
from converters import FORMATS, Checkpoint, read, write
from converters.__main__ import main
from converters.core import canonical_spec

HAVE_TORCH = importlib.util.find_spec("torch") is not None
MLP = zoo.tiny_config("mlp")
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
# A watchdog, not a clock assertion: a run still going after this long is hung (a slow one on
# a loaded machine passes); it dumps every thread's traceback and ends the test process.
HANG_SECONDS = 600
NAMES = {"eqx": "m.eqx", "nnx": "m_nnx", "linen": "m_linen", "canonical": "m.safetensors",
         "torch": "m.pt" if HAVE_TORCH else "m_t.safetensors"}


def _state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s.shape).astype(np.float32)
            for k, s in canonical_spec(MLP).items()}


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("orig")
    ck = Checkpoint(MLP, _state())
    return {fmt: write(ck, d / name, fmt) for fmt, name in NAMES.items()}


def _snapshot(folder: Path) -> dict[str, str]:
    """Every path under `folder` (links as links) with a digest of its content."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(folder))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def _run(argv: list) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in argv])
    finally:
        faulthandler.cancel_dump_traceback_later()
    err_text = err.getvalue()
    assert code in (0, 1, 2), (code, err_text)
    assert "Traceback" not in err_text, err_text
    if code:
        assert err_text.startswith("error:") and err_text.count("error:") == 1, err_text
    event(f"{argv[0]} exit {code}")
    return code, err_text


def _check_convert(work: Path, src: str, dst: str, to: str, *extra: str) -> int:
    """Convert `work/src` to `work/dst` and check every invariant of the module docstring."""
    before = _snapshot(work)
    code, err = _run(["convert", work / src, work / dst, "--to", to, *extra])
    after = _snapshot(work)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    if code:
        assert not changed, (err, changed)  # the source, and everything else, untouched
    else:
        assert all(k in (dst, dst + ".json") or k.startswith(dst + "/") for k in changed), changed
        read(work / dst)  # a complete checkpoint that loads
    assert not [k for k in after if Path(k).name.startswith(".zoo-")]
    return code


# --------------------------------------------------------------------------- file contents
@SETTINGS
@given(data=st.binary(max_size=600), suffix=st.sampled_from(["", ".eqx", ".pt", ".safetensors",
                                                              ".bin"]),
       to=st.sampled_from(FORMATS))
def test_random_bytes(tmp_path_factory, data, suffix, to):
    work = tmp_path_factory.mktemp("rb")
    (work / f"f{suffix}").write_bytes(data)
    _run(["inspect", work / f"f{suffix}"])
    _check_convert(work, f"f{suffix}", "out", to, "--arch", "mlp")


@settings(SETTINGS, max_examples=24)  # each example converts a damaged file: ~2 s
@given(fmt=st.sampled_from(sorted(NAMES)), cut=st.floats(0, 1), flips=st.lists(
    st.tuples(st.floats(0, 1), st.integers(0, 7)), max_size=3), to=st.sampled_from(FORMATS))
def test_truncated_and_bit_flipped_checkpoints(originals, tmp_path_factory, fmt, cut, flips, to):
    work = tmp_path_factory.mktemp("tf")
    src = work / originals[fmt].name
    if originals[fmt].is_dir():
        shutil.copytree(originals[fmt], src)
        files = sorted(p for p in src.rglob("*") if p.is_file())
        victim = files[int(cut * (len(files) - 1))]
    else:
        shutil.copy(originals[fmt], src)
        side = Path(str(originals[fmt]) + ".json")
        if side.exists():
            shutil.copy(side, work / side.name)
        victim = src
    data = bytearray(victim.read_bytes())
    if not flips:  # truncate
        data = data[:int(cut * len(data))]
    for where, bit in flips:
        if data:
            data[int(where * (len(data) - 1))] ^= 1 << bit
    victim.write_bytes(bytes(data))
    _run(["inspect", src])
    code = _check_convert(work, src.name, "out", to, "--model-only")
    if code == 0:  # accepted: the original values, unless the format carries no checksum
        got = read(work / "out").state
        want = _state()
        changed = [k for k in want if got[k].tobytes() != want[k].tobytes()]
        unchecked = originals[fmt].is_dir() or originals[fmt].suffix == ".safetensors"
        assert not changed or unchecked, (fmt, changed)


@SETTINGS
@given(field=st.sampled_from(["dtype", "step", "kind", "config", "optimizer",
                              "num_batches_tracked", "data", "zoo_checkpoint", "arch"]),
       value=st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(
           max_size=8) | st.floats(allow_nan=False), lambda c: st.lists(c, max_size=3)
           | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6),
       to=st.sampled_from(FORMATS))
def test_random_metadata(originals, tmp_path_factory, field, value, to):
    work = tmp_path_factory.mktemp("md")
    src = work / "m.eqx"
    shutil.copy(originals["eqx"], src)
    meta = json.loads(Path(str(originals["eqx"]) + ".json").read_text())
    meta[field] = value
    Path(str(src) + ".json").write_text(json.dumps(meta))
    _run(["inspect", src])
    _check_convert(work, "m.eqx", "out", to, "--model-only")


@SETTINGS
@given(config=st.dictionaries(st.sampled_from(["arch", "in_features", "hidden", "out_features",
                                               "activation", "dropout", "x"]),
                              st.none() | st.integers(-3, 20) | st.text(max_size=5)
                              | st.lists(st.integers(-1, 20), max_size=3), max_size=5))
def test_random_configs(originals, tmp_path_factory, config):
    work = tmp_path_factory.mktemp("cf")
    save_file(_state(), str(work / "bare.safetensors"))  # no metadata: the config comes from us
    _check_convert(work, "bare.safetensors", "out.eqx", "eqx", "--config", json.dumps(config))


# --------------------------------------------------------------------------- destinations
@SETTINGS
@given(parts=st.lists(st.sampled_from(["..", ".", "sub", "link", "m_nnx", "m.eqx", "new",
                                       "other"]), min_size=1, max_size=4),
       absolute=st.booleans(), force=st.booleans(), to=st.sampled_from(["eqx", "nnx",
                                                                         "canonical"]),
       src_name=st.sampled_from(["m_nnx", "m.eqx", "sub/../m.eqx", "link/m_nnx"]))
def test_random_destination_spellings(originals, tmp_path_factory, parts, absolute, force, to,
                                      src_name):
    root = tmp_path_factory.mktemp("dst")
    work = root / "run"
    (work / "sub").mkdir(parents=True)
    (work / "link").symlink_to(".")
    (work / "other").mkdir()
    (work / "other" / "thesis.txt").write_text("keep me")
    shutil.copytree(originals["nnx"], work / "m_nnx")
    shutil.copy(originals["eqx"], work / "m.eqx")
    shutil.copy(Path(str(originals["eqx"]) + ".json"), work / "m.eqx.json")
    dst = Path(*parts)
    resolved = Path(os.path.realpath(work / dst))
    if not str(resolved).startswith(str(work.resolve())):
        return  # outside the sandbox: not exercised
    dst = work / dst if absolute else dst
    cwd = os.getcwd()
    os.chdir(work / "sub")
    try:
        extra = ["--force"] if force else []
        src = Path("..") / src_name
        before = _snapshot(work)
        code, err = _run(["convert", src, dst if absolute else Path("..") / dst, "--to", to,
                          *extra])
    finally:
        os.chdir(cwd)
    after = _snapshot(work)
    assert (work / "other" / "thesis.txt").read_text() == "keep me"
    for name in ("m_nnx", "m.eqx"):  # the sources (and the other one) survive, or are replaced
        if (work / name).exists() and before.get(name) is not None and code == 0:
            read(work / name)
    src_real = Path(os.path.realpath(work / src_name))
    src_key = str(src_real.relative_to(work.resolve()))
    assert {k: v for k, v in after.items() if k == src_key or k.startswith(src_key + "/")} == {
        k: v for k, v in before.items() if k == src_key or k.startswith(src_key + "/")}, err
    if code:
        assert after == before, err
    else:
        spelled = dst if absolute else work / "sub" / ".." / dst
        target = str(Path(os.path.realpath(spelled)).relative_to(work.resolve()))
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        assert all(k in (target, target + ".json") or k.startswith(target + "/")
                   for k in changed), (target, changed)
    assert not [k for k in after if Path(k).name.startswith(".zoo-")]
