"""The format registry and the converter's promises: one class per format (a new format is one
registered class), `inspect`'s names and exit code, file modes, destinations named for another
format, dangling symbolic links."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import stat
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import zoo
from converters import Checkpoint, read, write
from converters.__main__ import main
from converters.checkpoints import DestinationWarning, format_names, inspect_checkpoint
from converters.checkpoints import format as fmt_registry
from converters.checkpoints.checkpoint import Detection
from converters.checkpoints.format import CheckpointFormat, Entry, Probe
from converters.checkpoints.io import ProgressFn
from converters.core import canonical_spec
from zoo.configs import config_from_dict

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs the torch extra")
CNN = zoo.tiny_config("cnn")


def state_of(config: zoo.Config, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (np.full((), 3, np.int64) if np.issubdtype(s.dtype, np.integer)
                else rng.standard_normal(s.shape).astype(np.float32))
            for k, s in canonical_spec(config).items()}


def run(*argv: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse
            code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def eqx_file(tmp_path_factory) -> Path:
    return write(Checkpoint(CNN, state_of(CNN)), tmp_path_factory.mktemp("src") / "m.eqx", "eqx")


# --------------------------------------------------------------------------- registry
class JsonArrays(CheckpointFormat):
    """A toy format: the canonical arrays as JSON lists, the config beside them."""

    name: ClassVar[str] = "toyjson"
    suffixes: ClassVar[tuple[str, ...]] = (".toyjson",)
    MAGIC: ClassVar[bytes] = b'{"toyjson": 1'

    def detect(self, probe: Probe) -> Detection | None:
        if not probe.head.startswith(self.MAGIC):
            return None
        return self.detection("starts with the toyjson marker",
                              json.loads(probe.path.read_text())["meta"])

    def rejection(self, probe: Probe) -> str:
        return "not a toyjson file"

    def read(self, path: Path, det: Detection, given: zoo.Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        data = json.loads(path.read_text())["arrays"]
        state = {k: np.asarray(v, dtype=d) for k, (v, d) in data.items()}
        return Checkpoint(config_from_dict(det.meta["config"]), state)

    def write(self, ck: Checkpoint, data: Path) -> None:
        arrays = {k: (v.tolist(), v.dtype.name) for k, v in ck.state.items()}
        data.write_text(json.dumps({"toyjson": 1, "meta": self.metadata(ck), "arrays": arrays}))

    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        data = json.loads(path.read_text())["arrays"]
        return [(k, np.shape(v), d) for k, (v, d) in data.items()]


def test_a_new_format_is_one_registered_class(eqx_file, tmp_path, monkeypatch):
    monkeypatch.setattr(fmt_registry, "_REGISTRY", list(fmt_registry._REGISTRY))
    fmt_registry.register(JsonArrays())
    assert "toyjson" in format_names()
    dst = tmp_path / "m.toyjson"
    code, _, err = run("convert", eqx_file, dst, "--to", "toyjson")  # the CLI's --to choices
    assert code == 0, err
    assert dst.read_bytes().startswith(JsonArrays.MAGIC)
    ck = read(dst)  # detected and read through the registry
    assert ck.source.fmt == "toyjson" and ck.config == CNN
    for k, v in read(eqx_file).state.items():
        np.testing.assert_array_equal(ck.state[k], v)
    report = inspect_checkpoint(dst)
    assert report.loads and len(report.entries) == len(ck.state)
    code, _, err = run("convert", dst, tmp_path / "back.eqx", "--to", "eqx")
    assert code == 0, err
    with pytest.raises(ValueError, match="registered already"):
        fmt_registry.register(JsonArrays())


# --------------------------------------------------------------------------- inspect
def test_inspect_of_an_equinox_file_shows_canonical_names(eqx_file):
    code, out, err = run("inspect", eqx_file)
    assert code == 0, err
    ck = read(eqx_file)
    assert f"{len(ck.state)} stored arrays" in out
    for key in ck.state:
        assert f" {key} " in out
    assert "#" not in out and "flat index" not in out and "inference" not in out
    code, out, err = run("convert", eqx_file, eqx_file.parent / "again.eqx", "--to", "eqx")
    assert code == 0 and f"{len(ck.state)} keys" in out, err


@needs_torch
@pytest.mark.parametrize("change", ["int32", "float16", "float_counter"])
def test_inspect_exits_1_when_the_checkpoint_does_not_load(change, tmp_path):
    import torch

    sd = zoo.create(CNN, "torch", seed=0).state_dict()
    if change == "int32":
        sd["fc1.weight"] = sd["fc1.weight"].to(torch.int32)
    elif change == "float16":
        sd["fc2.bias"] = sd["fc2.bias"].half()
    else:
        sd["bns.0.num_batches_tracked"] = torch.tensor(3.0)
    torch.save(sd, tmp_path / "m.pt")
    code, out, err = run("inspect", tmp_path / "m.pt", "--config", CNN.to_json())
    assert code == 1 and "loads into the zoo: no" in out, (out, err)
    assert err.startswith("error: ") and "converts with this mapping" not in out


# --------------------------------------------------------------------------- destinations
@pytest.mark.parametrize("name,to", [("c.safetensors", "canonical"),
                                     pytest.param("t.pt", "torch", marks=needs_torch),
                                     ("t.safetensors", "torch"), ("e.eqx", "eqx")])
def test_outputs_honour_the_umask(name, to, eqx_file, tmp_path):
    old = os.umask(0o022)
    try:
        dst = write(read(eqx_file), tmp_path / name, to)
        assert stat.S_IMODE(dst.stat().st_mode) == 0o644
        side = Path(str(dst) + ".json")
        assert not side.exists() or stat.S_IMODE(side.stat().st_mode) == 0o644
        os.umask(0o077)
        dst = write(read(eqx_file), tmp_path / name, to, force=True)
        assert stat.S_IMODE(dst.stat().st_mode) == 0o600
    finally:
        os.umask(old)


@pytest.mark.parametrize("name,to,names", [("x.safetensors", "eqx", "canonical or torch"),
                                           ("x.pt", "canonical", "torch"),
                                           ("x.eqx", "linen", "eqx")])
def test_a_destination_named_for_another_format_is_refused(name, to, names, eqx_file, tmp_path):
    code, _, err = run("convert", eqx_file, tmp_path / name, "--to", to)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert f"names the {names} format" in err
    assert not (tmp_path / name).exists() and list(tmp_path.iterdir()) == []


@needs_torch
def test_an_unusual_extension_is_warned_about(eqx_file, tmp_path):
    code, _, err = run("convert", eqx_file, tmp_path / "out.txt", "--to", "torch")
    assert code == 0 and err.startswith("warning: ") and err.count("\n") == 1, err
    assert "*.pt" in err and "*.txt" in err
    with pytest.warns(DestinationWarning, match="out2.txt"):
        write(read(eqx_file), tmp_path / "out2.txt", "torch")
    code, _, err = run("convert", eqx_file, tmp_path / "plain", "--to", "torch")
    assert code == 0 and err == "", err  # no extension: nothing to say


def test_a_dangling_symlink_counts_as_existing(eqx_file, tmp_path):
    link = tmp_path / "o.safetensors"
    link.symlink_to(tmp_path / "missing" / "target.safetensors")
    code, _, err = run("convert", eqx_file, link, "--to", "canonical")
    assert code == 1 and "already exists" in err and "dangling symbolic link" in err, err
    assert link.is_symlink() and not (tmp_path / "missing").exists()
    code, _, err = run("convert", eqx_file, link, "--to", "canonical", "--force")
    assert code == 0, err
    assert not link.is_symlink() and read(link).config == CNN  # the link itself replaced

