"""`python -m zoo.bench --mesh` in a fresh interpreter: the first run makes the 8 host devices
itself (XLA_FLAGS set before JAX starts), the others reuse them. Prints a JSON report of exit
codes, stderr and records that tests/test_bench_mesh.py checks. Run as
`python -m tests.bench_mesh_worker OUT_DIR`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import zoo
from zoo.bench import cli

HAVE_TORCH = any(impl == "torch" for _, impl in zoo.list_implementations())

COMMON = ["--preset", "tiny", "--batch", "8", "--repeat", "2", "--warmup", "1", "--rounds", "1",
          "--no-progress"]
RUNS = {
    # Equinox (per-sample, (out, in) kernels) against NNX (batched, (in, out)).
    "mlp-fsdp": ["mlp", "--mesh", "8", "--strategy", "fsdp", "--mode", "both", "--impl",
                 "eqx,nnx"],
    # PyTorch asked for: left out (not sharded), which the record states.
    "mlp-dp": ["mlp", "--mesh", "8", "--strategy", "dp", "--mode", "train", "--impl",
               ",".join(["nnx", *(["torch"] if HAVE_TORCH else [])])],
    "cnn-fsdp": ["cnn", "--mesh", "8", "--strategy", "fsdp", "--mode", "train", "--impl",
                 "eqx,linen"],
    # im2col convolutions run in loops whose trips the FLOP check counts over every device.
    "loops-fsdp": ["decoder3d", "--mesh", "8", "--strategy", "fsdp", "--mode", "train",
                   "--impl", "eqx,nnx"],
    "tp-no-dims": ["decoder3d", "--mesh", "4x2", "--strategy", "tp", "--mode", "forward"],
    "tp-one-axis": ["mlp", "--mesh", "8", "--strategy", "tp"],
    "mesh-3": ["mlp", "--mesh", "3", "--strategy", "fsdp", "--mode", "forward"],
}


def run(name: str, argv: list[str], out: str) -> dict:
    path = os.path.join(out, f"{name}.json")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main([*argv, *COMMON, "--json", path])
        except SystemExit as e:
            code = e.code
    record = json.loads(Path(path).read_text()) if os.path.exists(path) else None
    return {"code": code, "stderr": err.getvalue(), "record": record}


def main() -> None:
    out = sys.argv[1]
    report = {name: run(name, argv, out) for name, argv in RUNS.items()}
    import jax

    report["devices"] = jax.device_count()
    report["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
