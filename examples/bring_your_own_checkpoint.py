"""Bring your own checkpoint: the Flax Linen MNIST example's CNN, saved with orbax by its own
code (auto-named `Conv_0`, `Dense_1`, ...), converted into the zoo's `cnn` in every library.

    python examples/bring_your_own_checkpoint.py [--out-dir DIR]

1. defines the CNN exactly as flax/examples/mnist does and saves its variables with orbax;
2. converts the directory with the command line, which matches the layers by kind, order and
   shapes, prints the mapping table, permutes the flattened dense layer's rows from Flax's
   (H, W, C) order to PyTorch's (C, H, W) and checks Linen against PyTorch before writing:
       python -m converters convert linen_mnist cnn.pt --to torch --arch cnn \\
           --config '{"batch_norm": false}'
3. loads the result into Equinox, Linen, NNX and PyTorch and compares each output with the
   original Linen model's on the same input (prints the largest relative difference).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

try:
    import zoo  # noqa: F401
except ImportError:  # running from a checkout without installing it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

import converters
from converters.__main__ import main as cli
from converters.matching.verify import forward, max_difference, tolerance


class CNN(nn.Module):
    """flax/examples/mnist/train.py, verbatim."""

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(features=32, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = nn.Conv(features=64, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))  # flatten
        x = nn.Dense(features=256)(x)
        x = nn.relu(x)
        x = nn.Dense(features=10)(x)
        return x


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, default=None,
                   help="keep the checkpoints here (default: a temporary folder, removed "
                        "at the end)")
    args = p.parse_args(argv)
    return run_in_out_dir(args.out_dir, "byo_", bring_your_own)


def bring_your_own(out: Path) -> int:
    """Steps 1-3 in folder `out`."""

    # 1. the user's own model and checkpoint
    module = CNN()
    variables = jax.jit(module.init)(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    src = out / "linen_mnist"
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(src.absolute(), variables)
        ckptr.wait_until_finished()

    # 2. one command converts it (the table and the verification are printed)
    dst = out / "cnn.pt"
    code = cli(["convert", str(src), str(dst), "--to", "torch", "--arch", "cnn",
                "--config", '{"batch_norm": false}', "--force"])
    if code:
        return code

    # 3. every library reproduces the original model
    x = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32)
    reference = forward((module, variables), "linen", x)
    worst = 0.0
    for impl in ("eqx", "linen", "nnx", "torch"):
        diff = max_difference(reference, forward(converters.load(dst, impl), impl, x))
        print(f"{impl:>5}: max relative difference {diff:.2e}")
        worst = max(worst, diff)
    ok = worst <= tolerance()
    print("OK" if ok else f"FAILED: {worst:.2e} > {tolerance():.2e}")
    return 0 if ok else 1


def run_in_out_dir(out_dir: Path | None, prefix: str, body) -> int:
    """`body(folder)` in `out_dir`, or in a temporary folder removed afterwards (the default)."""
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        return body(out_dir)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        code = body(Path(tmp))
    print("(written to a temporary folder, now removed: keep the files with --out-dir DIR)")
    return code


if __name__ == "__main__":
    sys.exit(main())
