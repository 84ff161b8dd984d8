"""Checkpoint files: every format, every pair of formats, native files, the CLI."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import converters
import zoo
from converters import FORMATS, Checkpoint, convert_file, read, write
from converters.__main__ import main
from converters.core import ConversionError, canonical_spec, from_canonical
from zoo.registry import skeleton

ROOT = Path(__file__).resolve().parents[1]
HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs the torch extra")
SMALL = {
    "mlp": dict(in_features=8, hidden=(16, 16), out_features=4),
    "cnn": dict(features=(4, 8), hidden=16, input_size=(8, 8)),
    "decoder3d": dict(latent_channels=8, channels=(4, 4, 4), latent_size=(2, 2, 2)),
}
ARCHS = sorted({arch for arch, _ in zoo.list_implementations()})
# source name -> (format, file name): torch comes as .pt and as .safetensors
SOURCES = {
    "eqx": ("eqx", "m.eqx"), "linen": ("linen", "m_linen"), "nnx": ("nnx", "m_nnx"),
    "canonical": ("canonical", "m.safetensors"), "torch": ("torch", "m.pt"),
    "torch-st": ("torch", "m_torch.safetensors"),
}
if not HAVE_TORCH:  # .pt files need PyTorch; PyTorch-layout safetensors do not
    del SOURCES["torch"]
DST_NAMES = {"eqx": "out.eqx", "linen": "out_linen", "nnx": "out_nnx",
             "canonical": "out.safetensors",
             "torch": "out.pt" if HAVE_TORCH else "out_torch.safetensors",
             "npz": "out.npz", "msgpack": "out.msgpack"}


def small_config(arch: str) -> zoo.Config:
    if arch in SMALL:
        return zoo.make_config(arch, **SMALL[arch])
    cls = type(zoo.make_config(arch))  # an architecture added later: its tiny preset if any
    return cls.tiny() if hasattr(cls, "tiny") else cls()


def random_state(config: zoo.Config, dtype: str = "float32", seed: int = 0) -> dict:
    """A canonical state with random values everywhere (counters too: they must survive)."""
    rng = np.random.default_rng(seed)
    return {k: (np.asarray(rng.integers(1, 1000), np.int64) if np.issubdtype(s.dtype, np.integer)
                else rng.standard_normal(s.shape).astype(np.float32).astype(dtype))
            for k, s in canonical_spec(config).items()}


def assert_bitwise(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k in want:
        g, w = np.asarray(got[k]), np.asarray(want[k])
        assert g.dtype == w.dtype, (k, g.dtype, w.dtype)
        assert g.shape == w.shape, (k, g.shape, w.shape)
        assert g.tobytes() == w.tobytes(), k


def write_sources(ck: Checkpoint, folder: Path) -> dict[str, Path]:
    folder.mkdir(exist_ok=True)
    return {name: write(ck, folder / fname, fmt) for name, (fmt, fname) in SOURCES.items()}


# --------------------------------------------------------------------------- round trips
@pytest.mark.whole_model
@pytest.mark.parametrize("arch", ARCHS)
def test_every_pair_of_formats_is_bitwise_exact(arch, tmp_path):
    cfg = small_config(arch)
    state = random_state(cfg)
    sources = write_sources(Checkpoint(cfg, state), tmp_path / "src")
    for name, src in sources.items():
        assert read(src).source.fmt == SOURCES[name][0]
        for fmt in FORMATS:
            dst = tmp_path / f"{name}-{DST_NAMES[fmt]}"
            convert_file(src, dst, to=fmt)
            got = read(dst)
            assert got.config == cfg and got.source.fmt == fmt
            assert_bitwise(got.state, state)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_dtypes_round_trip_exactly(dtype, tmp_path):
    cfg = small_config("cnn")
    state = random_state(cfg, dtype)
    sources = write_sources(Checkpoint(cfg, state), tmp_path)
    for name, src in sources.items():
        got = read(src)
        assert got.dtype == np.dtype(jax.numpy.dtype(dtype)), name
        assert_bitwise(got.state, state)
    convert_file(sources["torch-st"], tmp_path / "chain.eqx", to="eqx")
    convert_file(tmp_path / "chain.eqx", tmp_path / "chain_nnx", to="nnx")
    convert_file(tmp_path / "chain_nnx", tmp_path / "chain_linen", to="linen")
    assert_bitwise(read(tmp_path / "chain_linen").state, state)


# --------------------------------------------------------------------------- native files
@pytest.fixture(scope="module")
def cnn():
    cfg = small_config("cnn")
    state = random_state(cfg)
    state = {k: (np.zeros((), np.int64) if k.endswith("num_batches_tracked") else v)
             for k, v in state.items()}  # what the JAX libraries' own files imply
    return cfg, state


@needs_torch
def test_reads_files_written_by_each_librarys_own_api(cnn, tmp_path):
    import safetensors.torch
    import torch

    cfg, state = cnn
    tm = from_canonical(state, cfg, "torch")
    torch.save(tm.state_dict(), tmp_path / "sd.pt")
    safetensors.torch.save_file(tm.state_dict(), tmp_path / "sd.safetensors")
    _module, variables = from_canonical(state, cfg, "linen")
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "linen_std", variables)
    ocp.PyTreeCheckpointer().save(tmp_path / "linen_pytree", variables)
    model = from_canonical(state, cfg, "nnx")
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "nnx_std", nnx.state(model))
        ckptr.save(tmp_path / "nnx_pure", nnx.to_pure_dict(nnx.state(model)))
    eqx.tree_serialise_leaves(tmp_path / "m.eqx", from_canonical(state, cfg, "eqx"))
    expected = {"sd.pt": "torch", "sd.safetensors": "torch", "linen_std": "linen",
                "linen_pytree": "linen", "nnx_std": "nnx", "nnx_pure": "nnx", "m.eqx": "eqx"}
    for name, fmt in expected.items():
        with pytest.raises(converters.CheckpointError, match="--arch"):
            read(tmp_path / name)  # no architecture stored in a library's own file
        got = read(tmp_path / name, config=cfg.to_json())
        assert got.source.fmt == fmt, name
        assert_bitwise(got.state, state)


@needs_torch
def test_written_files_load_with_each_librarys_own_api(cnn, tmp_path):
    import safetensors.torch
    import torch

    cfg, state = cnn
    ck = Checkpoint(cfg, state)
    # PyTorch: a plain state_dict, strict load, safe loader
    tm = zoo.model_class("cnn", "torch")(cfg)
    tm.load_state_dict(torch.load(write(ck, tmp_path / "m.pt", "torch"), weights_only=True))
    assert_bitwise(converters.to_canonical(tm, "torch"), state)
    tm2 = zoo.model_class("cnn", "torch")(cfg)
    tm2.load_state_dict(safetensors.torch.load_file(write(ck, tmp_path / "c.safetensors",
                                                          "canonical")))
    assert_bitwise(converters.to_canonical(tm2, "torch"), state)
    # NNX: the documented pattern (nnx.eval_shape, restore into the abstract state, merge)
    path = write(ck, tmp_path / "m_nnx", "nnx")
    abstract_model = nnx.eval_shape(lambda: zoo.model_class("cnn", "nnx")(
        cfg, rngs=nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract_model)
    with ocp.StandardCheckpointer() as ckptr:
        restored = ckptr.restore(path.absolute(), abstract_state)
    model = nnx.merge(graphdef, restored)
    assert_bitwise(converters.to_canonical(model, "nnx"),
                   {k: (v if not k.endswith("tracked") else np.zeros((), np.int64))
                    for k, v in state.items()})
    # Linen: the variables, restored as saved
    path = write(ck, tmp_path / "m_linen", "linen")
    with ocp.StandardCheckpointer() as ckptr:
        variables = ckptr.restore(path.absolute())
    assert set(variables) == {"params", "batch_stats"}
    assert_bitwise(converters.to_canonical((skeleton(cfg, "linen")[0], variables), "linen"),
                   state)
    # Equinox: tree_deserialise_leaves into the zoo's skeleton
    path = write(ck, tmp_path / "m.eqx", "eqx")
    loaded = eqx.tree_deserialise_leaves(path, skeleton(cfg, "eqx"))
    assert_bitwise(converters.to_canonical(loaded, "eqx"), state)
    sidecar = json.loads((tmp_path / "m.eqx.json").read_text())
    assert sidecar["arch"] == "cnn" and zoo.configs.config_from_dict(sidecar["config"]) == cfg


def test_num_batches_tracked_survives_the_jax_formats(tmp_path):
    cfg = small_config("cnn")
    state = random_state(cfg)
    assert int(state["bns.0.num_batches_tracked"]) > 0
    for fmt in ("eqx", "linen", "nnx"):
        got = read(write(Checkpoint(cfg, state), tmp_path / f"x_{fmt}", fmt))
        assert_bitwise(got.state, state)  # kept in the sidecar / zoo.json


# --------------------------------------------------------------------------- Python API
@needs_torch
def test_python_api_load_save_and_canonical_helpers(cnn, tmp_path):
    cfg, state = cnn
    for impl in ("eqx", "linen", "nnx", "torch"):
        model = from_canonical(state, cfg, impl)
        path = converters.save(model, tmp_path / f"{impl}.safetensors", "canonical")
        assert_bitwise(converters.load(path).state, state)
        back = converters.load(path, impl)
        assert_bitwise(converters.to_canonical(back, impl), state)
    p = converters.save_canonical(tmp_path / "s.safetensors", state, cfg)
    got_state, got_cfg = converters.load_canonical(p)
    assert got_cfg == cfg
    assert_bitwise(got_state, state)
    from safetensors import safe_open

    with safe_open(str(p), "np") as f:
        meta = f.metadata()
    assert meta["arch"] == "cnn" and zoo.configs.config_from_dict(json.loads(meta["config"])) == cfg
    assert meta["format_version"] == "1"
    with pytest.raises(converters.CheckpointError, match="already exists"):
        converters.save_canonical(p, state, cfg)
    converters.save_canonical(p, state, cfg, force=True)
    assert converters.load(p, "canonical").keys() == state.keys()


def test_failed_write_leaves_nothing_and_keeps_the_old_output(cnn, tmp_path, monkeypatch):
    import equinox

    cfg, state = cnn
    ck = Checkpoint(cfg, state)
    old = write(ck, tmp_path / "keep.eqx", "eqx")
    before = old.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(equinox, "tree_serialise_leaves", boom)
    for dst, force in ((tmp_path / "new.eqx", False), (old, True)):
        with pytest.raises(converters.CheckpointError, match="disk full"):
            write(ck, dst, "eqx", force=force)
    assert not (tmp_path / "new.eqx").exists() and not (tmp_path / "new.eqx.json").exists()
    assert old.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.eqx", "keep.eqx.json"]


# --------------------------------------------------------------------------- command line
def test_cli_convert_detects_refuses_overwrite_and_forces(cnn, tmp_path, capsys):
    cfg, state = cnn
    src = write(Checkpoint(cfg, state), tmp_path / "m.eqx", "eqx")
    dst = tmp_path / "m_nnx"
    assert main(["convert", str(src), str(dst), "--to", "nnx"]) == 0
    out = capsys.readouterr().out
    assert "detected format: eqx" in out and "Equinox" in out and "wrote" in out
    assert_bitwise(read(dst).state, state)
    stamp = sorted(p.name for p in dst.iterdir())
    assert main(["convert", str(src), str(dst), "--to", "nnx"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert sorted(p.name for p in dst.iterdir()) == stamp
    assert main(["convert", str(src), str(dst), "--to", "linen", "--force", "--progress"]) == 0
    assert read(dst).source.fmt == "linen"


@needs_torch
def test_cli_bare_torch_file_needs_arch_and_config(cnn, tmp_path, capsys):
    import torch

    cfg, state = cnn
    torch.save(from_canonical(state, cfg, "torch").state_dict(), tmp_path / "bare.pt")
    dst = tmp_path / "out.eqx"
    assert main(["convert", str(tmp_path / "bare.pt"), str(dst), "--to", "eqx"]) == 1
    err = capsys.readouterr().err
    assert "--arch" in err and "'cnn'" in err and not dst.exists()
    # --arch alone: the default config does not fit; the first bad keys are named, and how
    # many more lines --debug shows (its error names every one)
    assert main(["convert", str(tmp_path / "bare.pt"), str(dst), "--to", "eqx",
                 "--arch", "cnn"]) == 1
    err = capsys.readouterr().err
    assert "'convs.0.weight': expected shape" in err and len(err.splitlines()) == 14
    assert err.splitlines()[-1].endswith("more lines (--debug shows them all)")
    with pytest.raises(ConversionError, match=r"(?s)'convs\.0\.weight'.*'fc1\.weight'"):
        main(["convert", str(tmp_path / "bare.pt"), str(dst), "--to", "eqx", "--arch", "cnn",
              "--debug"])
    assert not dst.exists()
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(cfg.to_json())
    assert main(["convert", str(tmp_path / "bare.pt"), str(dst), "--to", "eqx",
                 "--config", str(cfg_file)]) == 0
    overrides = json.dumps({k: v for k, v in cfg.to_dict().items() if k != "arch"})
    assert main(["convert", str(tmp_path / "bare.pt"), str(tmp_path / "o2.safetensors"),
                 "--to", "canonical", "--arch", "cnn", "--config", overrides]) == 0
    assert_bitwise(read(dst).state, state)


@needs_torch
def test_cli_inspect(cnn, tmp_path, capsys):
    cfg, state = cnn
    path = write(Checkpoint(cfg, state), tmp_path / "m_linen", "linen")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "format: linen" in out and '"arch": "cnn"' in out
    assert "params.fc1.kernel" in out and "(32, 16)" in out and "float32" in out
    n_params = sum(v.size for k, v in state.items()
                   if not k.endswith(("running_mean", "running_var", "tracked")))
    assert f"{n_params:,}" in out and "loads into the zoo: yes" in out
    # a bare file: listed, the architecture guessed, no validation possible
    import torch

    torch.save(from_canonical(state, cfg, "torch").state_dict(), tmp_path / "bare.pt")
    assert main(["inspect", str(tmp_path / "bare.pt")]) == 0
    out = capsys.readouterr().out
    assert "convs.0.weight" in out and "loads into the zoo: unknown" in out and "'cnn'" in out
    # validated against a wrong config: reported, non-zero
    wrong = json.dumps({**cfg.to_dict(), "hidden": 32})
    assert main(["inspect", str(tmp_path / "bare.pt"), "--config", wrong]) == 1
    out, err = capsys.readouterr()
    assert "loads into the zoo: no" in out and "'fc1.weight': expected shape (32, 32)" in err
    assert err.startswith("error:")


def test_cli_runs_as_a_module(cnn, tmp_path):
    cfg, state = cnn
    path = write(Checkpoint(cfg, state), tmp_path / "m.safetensors", "canonical")
    done = subprocess.run([sys.executable, "-m", "converters", "inspect", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "format: canonical" in done.stdout and "bns.1.running_var" in done.stdout
