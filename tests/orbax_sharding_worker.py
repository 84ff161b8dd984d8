"""One process on 8 CPU devices: a model (the ViT's and the Llama family's tiny configs, in
turn) sharded over 8 devices (fsdp) in each JAX library is saved as an orbax checkpoint (the
orbax formats in turn; each device writes its shards), restored onto 2 devices and onto 1
(`converters.load(..., mesh=, strategy=)`) and converted to PyTorch by the command line; prints
a JSON report that tests/test_sharding.py checks. With `--exhaustive`, both models in every
library. Run as `python -m tests.orbax_sharding_worker SCRATCH_DIR [--exhaustive]` (the device
count is set before JAX starts)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
import torch

import canonical
import converters
import zoo
from converters.__main__ import main as cli
from zoo.registry import walk_facts
from zoo.runtime import precision, sharding

ORBAX = ("linen", "nnx")  # the orbax checkpoint formats
ARCHS = ("vit", "llama")  # attention and dense layers; a language model (token ids, RMSNorm)
MESHES = (2, 1)  # the device counts the 8-device checkpoints are restored onto


def _state(model: object, impl: str, cfg: zoo.Config) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in
            canonical.read(model, impl, **walk_facts(cfg, impl)).items()}


def _diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    return max(float(np.max(np.abs(a[k] - b[k]), initial=0.0)) for k in b)


def _devices(model: object, impl: str) -> list[int]:
    """The numbers of devices the model's arrays lie on."""
    arrays = jax.tree.leaves(zoo.interface(impl).split(model)[1:])
    return sorted({len(a.sharding.device_set) for a in arrays if isinstance(a, jax.Array)})


def _cases(every: bool) -> list[tuple[str, int, str]]:
    """(architecture, turn, library): each library with the architectures in turn, or every
    pair (`every`); the turn picks the orbax format."""
    if every:
        return [(a, i, impl) for a in ARCHS for i, impl in enumerate(zoo.JAX_IMPLS)]
    return [(ARCHS[i % len(ARCHS)], i, impl) for i, impl in enumerate(zoo.JAX_IMPLS)]


def main(scratch: Path, every: bool) -> None:
    precision.set_global(precision.EXACT)
    mesh8 = jax.make_mesh((8,), (sharding.DATA,))
    restored, torch_outputs = [], []
    for arch, i, impl in _cases(every):
        cfg = zoo.tiny_config(arch)
        x = zoo.example_input(cfg, 4, seed=1)
        model = zoo.create(cfg, impl, mesh=mesh8, strategy="fsdp")
        want = _state(model, impl, cfg)
        api = zoo.interface(impl)
        out8 = np.asarray(api.to_canonical(api.forward(model, api.to_native(x, cfg)), cfg))
        for fmt in (ORBAX[i % len(ORBAX)],):  # each library in one format, in turn
            path = scratch / f"{arch}-{impl}-as-{fmt}"
            converters.save(model, path, fmt)
            for n in MESHES:
                mesh = jax.make_mesh((n,), (sharding.DATA,), devices=jax.devices()[:n])
                back = converters.load(path, impl, mesh=mesh, strategy="fsdp")
                restored.append({"arch": arch, "impl": impl, "format": fmt, "devices": n,
                                 "diff": _diff(_state(back, impl, cfg), want),
                                 "on": _devices(back, impl),
                                 "bytes_per_device": sharding.bytes_per_device(back),
                                 "sharding_file": (path / "_sharding").exists()})
            pt = scratch / f"{arch}-{impl}-as-{fmt}.pt"
            with contextlib.redirect_stdout(io.StringIO()):  # stdout carries the report
                status = cli(["convert", str(path), str(pt), "--to", "torch", "--no-progress"])
            with torch.no_grad():
                out = converters.load(pt, "torch").eval()(torch.from_numpy(np.array(x)))
            out = out.numpy()
            torch_outputs.append({"arch": arch, "impl": impl, "format": fmt, "status": status,
                                  "diff": float(np.max(np.abs(out - out8))),
                                  "scale": float(np.max(np.abs(out8)))})
    json.dump({"devices": jax.device_count(), "restored": restored, "torch": torch_outputs},
              sys.stdout)


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--exhaustive" in sys.argv[2:])
