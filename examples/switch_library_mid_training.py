"""Train a CNN on scikit-learn's digits in Equinox, switch to Flax Linen half-way, keep going.

    python examples/switch_library_mid_training.py [--steps 300] [--switch-at 150] [--out-dir DIR]

Needs scikit-learn and matplotlib: `pip install -e ".[examples]"`. Without `--out-dir` the
checkpoints and the loss plot go to a temporary folder that is removed at the end.

The switch goes through files, as it would between two jobs: the Equinox run saves a training
checkpoint (parameters, BatchNorm statistics, Adam's state, step) with `converters.save`, the
file is converted into a Linen orbax checkpoint with `converters.convert_file`, and the Linen run
resumes from it with `converters.load(..., optimizer=tx)`. Both libraries train with the zoo's
one training step, `zoo.runtime.fast.train_step`. Prints the loss curve and saves it as a PNG.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path

try:
    import zoo
except ImportError:  # running from a checkout without installing it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import zoo

import jax
import numpy as np
import optax

import converters
from zoo.runtime import fast
from zoo.runtime.training import cross_entropy


def digits(seed: int) -> tuple[np.ndarray, ...]:
    """8x8 digit images as (N, 1, 8, 8) float32 in [0, 1]; a 80/20 train/test split."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n = int(0.8 * len(x))
    return x[:n], y[:n], x[n:], y[n:]


def accuracy(impl: str, model, x: np.ndarray, y: np.ndarray) -> float:
    api = zoo.interface(impl)
    static, params, state = api.split(model)
    predict = jax.jit(lambda p, s, x: api.to_canonical(api.apply(static, p, s, x)[0]))
    logits = predict(params, state, api.to_native(x))
    return float(np.mean(np.argmax(np.asarray(logits), -1) == y))


def run(impl: str, model, tx, opt_state, steps: range, data, batch: int, seed: int,
        every: int, losses: list[tuple[int, float]]):
    """Train with the zoo's training step (`zoo.runtime.fast.train_step`), resuming `opt_state`."""
    api = zoo.interface(impl)
    step = fast.train_step(model, impl, tx, cross_entropy, opt_state=opt_state)
    x_train, y_train = data
    rng = np.random.default_rng(seed + steps.start)  # batches depend on the step only
    for i in steps:
        idx = rng.integers(0, len(x_train), batch)
        loss = step(api.to_native(x_train[idx]), y_train[idx])
        losses.append((i + 1, float(loss)))
        if (i + 1) % every == 0 or i + 1 == steps.stop:
            print(f"  [{impl:>5}] step {i + 1:4d}  loss {float(loss):.4f}")
    return step.model(), step.opt_state


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="total training steps")
    p.add_argument("--switch-at", type=int, default=None,
                   help="step at which to move from Equinox to Linen (default: half-way)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=None,
                   help="keep the checkpoints and the PNG plot here (default: a temporary "
                        "folder, removed at the end)")
    args = p.parse_args(argv)
    missing = [name for module, name in (("sklearn", "scikit-learn"), ("matplotlib", "matplotlib"))
               if not _importable(module)]
    if missing:
        p.exit(1, f"{p.prog}: needs {' and '.join(missing)}: pip install -e \".[examples]\"\n")
    switch = args.steps // 2 if args.switch_at is None else args.switch_at
    if not 0 < switch < args.steps:
        p.error("--switch-at must be between 0 and --steps")
    return run_in_out_dir(args.out_dir, "switch_library_",
                          lambda out: train_and_switch(args, switch, out))


def train_and_switch(args: argparse.Namespace, switch: int, out: Path) -> int:
    """Train, switch at step `switch`, train on; checkpoints and the plot in folder `out`."""
    every = max(1, args.steps // 10)

    x_train, y_train, x_test, y_test = digits(args.seed)
    # bn_momentum 0.9: the running statistics catch up within a few hundred steps
    config = zoo.make_config("cnn", input_size=(8, 8), features=(16, 32), hidden=64,
                             bn_momentum=0.9)
    tx = optax.adam(args.lr)
    losses: list[tuple[int, float]] = []

    print(f"digits: {len(x_train)} training / {len(x_test)} test images of 8x8; "
          f"{config.arch} {config.to_json()}")
    print(f"Equinox: steps 1-{switch}")
    model = zoo.create(config, "eqx", seed=args.seed)
    model, opt_state = run("eqx", model, tx, None, range(switch), (x_train, y_train),
                           args.batch_size, args.seed, every, losses)
    acc_eqx = accuracy("eqx", model, x_test, y_test)

    eqx_file = out / "digits_step.eqx"
    converters.save(model, eqx_file, "eqx", opt_state=opt_state, step=switch, force=True)
    linen_dir = out / "digits_step_linen"
    converters.convert_file(eqx_file, linen_dir, to="linen", force=True)
    model, opt_state, step = converters.load(linen_dir, "linen", optimizer=tx)
    acc_linen = accuracy("linen", model, x_test, y_test)
    print(f"switched at step {step}: {eqx_file.name} -> {linen_dir.name} "
          f"(test accuracy {acc_eqx:.3f} in Equinox, {acc_linen:.3f} in Linen)")

    print(f"Linen: steps {switch + 1}-{args.steps}")
    model, opt_state = run("linen", model, tx, opt_state, range(switch, args.steps),
                           (x_train, y_train), args.batch_size, args.seed, every, losses)
    acc = accuracy("linen", model, x_test, y_test)
    print(f"final test accuracy (Linen): {acc:.3f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, values = zip(*losses, strict=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps[:switch], values[:switch], label="Equinox")
    ax.plot(steps[switch - 1:], values[switch - 1:], label="Flax Linen")
    ax.axvline(switch, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy)")
    ax.set_title("CNN on digits: Equinox, then Linen from a converted checkpoint")
    ax.legend()
    fig.tight_layout()
    png = out / "switch_library_mid_training.png"
    fig.savefig(png, dpi=100)
    print(f"loss curve: {png}")
    return 0


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


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
