"""Port a PyTorch checkpoint into Flax NNX and Equinox, and check the outputs agree.

    python examples/port_torch_checkpoint.py [--arch cnn] [--out-dir DIR]

1. builds a PyTorch model of the zoo with PyTorch's own initialisation, runs a few batches in
   training mode (so the BatchNorm running statistics are not trivial), and saves its
   `state_dict` with plain `torch.save`: a checkpoint as any PyTorch user would have it;
2. converts that file with `converters.convert_file` into an NNX orbax checkpoint and an
   Equinox leaf file (the bare .pt carries no architecture, so the config is passed);
3. loads both with `converters.load` and compares their eval-mode outputs with PyTorch's on the
   same input, printing the largest absolute difference.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

try:
    import zoo
except ImportError:  # running from a checkout without installing it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import zoo

import numpy as np
import torch

import converters

TOLERANCE = 1e-4  # float32; the zoo's equivalence tests see ~1e-6 on these models


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="cnn", choices=zoo.ARCHS)
    p.add_argument("--out-dir", type=Path, default=None,
                   help="keep the checkpoints here (default: a temporary folder, removed "
                        "at the end)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    return run_in_out_dir(args.out_dir, "port_torch_", lambda out: port(args, out))


def port(args: argparse.Namespace, out: Path) -> int:
    """Steps 1-3 in folder `out`."""
    config = zoo.make_config(args.arch, **({"input_size": (8, 8)} if args.arch == "cnn" else {}))

    # 1. a PyTorch model and its state_dict, saved the PyTorch way
    torch.manual_seed(args.seed)
    model = zoo.model_class(args.arch, "torch")(config)
    model.train()
    with torch.no_grad():
        for _ in range(3):  # moves the BatchNorm running statistics, if any
            model(torch.randn(args.batch, *config.input_shape))
    model.eval()
    pt = out / "model.pt"
    torch.save(model.state_dict(), pt)
    print(f"PyTorch {args.arch}: saved {len(model.state_dict())} tensors to {pt}")

    # 2. convert the file into NNX and Equinox checkpoints
    targets = {"nnx": out / "model_nnx", "eqx": out / "model.eqx"}
    for impl, path in targets.items():
        converters.convert_file(pt, path, to=impl, config=config, force=True)
        print(f"converted -> {impl}: {path}")

    # 3. same input, eval mode, compare outputs
    x = np.random.default_rng(args.seed).standard_normal((args.batch, *config.input_shape))
    x = x.astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    worst = 0.0
    for impl, path in targets.items():
        native = converters.load(path, impl)
        api = zoo.interface(impl)
        static, params, state = api.split(native)
        y, _ = api.apply(static, params, state, api.to_native(x), train=False)
        diff = float(np.max(np.abs(np.asarray(api.to_canonical(y)) - want)))
        worst = max(worst, diff)
        print(f"{impl:>4} vs PyTorch: max abs difference {diff:.3e} on outputs of shape "
              f"{want.shape}")
    ok = worst < TOLERANCE
    print(f"{'OK' if ok else 'MISMATCH'}: largest difference {worst:.3e} (tolerance {TOLERANCE})")
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
