"""Fine-tune a torchvision ResNet-18 checkpoint in Flax NNX on a new 10-class task, write it back.

    python examples/finetune_resnet.py [--steps 150] [--batch-size 64] [--out-dir DIR]

Needs PyTorch with torchvision and scikit-learn: `pip install -e ".[torch,examples]"`. Without
`--out-dir` the checkpoints go to a temporary folder that is removed at the end.

1. A torchvision-layout checkpoint: `torchvision.models.resnet18()` (random weights here, since
   nothing is downloaded; a published one loads the same way) saved with `torch.save`.
2. Loaded into NNX with a new 10-class head, as timm loads pretrained weights:
   `zoo.create("resnet18", "nnx", weights=PATH, num_classes=10, input_size=(32, 32))` (the fc
   layer is re-initialised, and says so).
3. Fine-tuned on scikit-learn's digits (8x8, upsampled to 32x32, grey repeated over RGB) with the
   zoo's training step and a progress bar, then evaluated on held-out digits.
4. Written back as a PyTorch state_dict, which `torchvision.models.resnet18(num_classes=10)` loads
   with `strict=True` and which gives the NNX model's outputs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import warnings
from pathlib import Path

try:
    import zoo
except ImportError:  # running from a checkout without installing it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import zoo

import jax
import numpy as np
import optax
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import converters
from zoo.runtime import fast, precision
from zoo.runtime.training import cross_entropy

SIZE = 32  # digits are upsampled from 8x8 to SIZE x SIZE


def digits(seed: int) -> tuple[np.ndarray, ...]:
    """Digits as (N, 3, SIZE, SIZE) float32, normalised; a 80/20 train/test split."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    x = np.asarray(jax.image.resize(x, (len(x), 1, SIZE, SIZE), "bilinear"))
    x = np.repeat((x - x.mean()) / x.std(), 3, axis=1)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n = int(0.8 * len(x))
    return x[order[:n]], y[order[:n]], x[order[n:]], y[order[n:]]


def logits(model, x: np.ndarray) -> np.ndarray:
    """Eval-mode logits of the NNX `model` on canonical (N, C, H, W) images."""
    api = zoo.interface("nnx")
    return np.asarray(api.to_canonical(api.forward(model, api.to_native(x))))


def fine_tune(model, data: tuple[np.ndarray, np.ndarray], steps: int, batch: int, lr: float,
              seed: int):
    """Adam on the cross-entropy with the zoo's training step; a rich progress bar."""
    api = zoo.interface("nnx")
    step = fast.train_step(model, "nnx", optax.adam(lr), cross_entropy)
    x_train, y_train = data
    rng = np.random.default_rng(seed)
    columns = (TextColumn("fine-tuning"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.4f}"), TimeElapsedColumn())
    with Progress(*columns) as bar:
        task = bar.add_task("steps", total=steps, loss=float("nan"))
        for _ in range(steps):
            idx = rng.integers(0, len(x_train), batch)
            loss = step(api.to_native(x_train[idx]), y_train[idx])
            bar.update(task, advance=1, loss=float(loss))
    print(f"final training loss {float(loss):.4f}")
    return step.model()


def run(args: argparse.Namespace, out: Path) -> int:
    import torch
    import torchvision

    x_train, y_train, x_test, y_test = digits(args.seed)
    source = out / "resnet18_torchvision.pt"
    torch.manual_seed(args.seed)
    torch.save(torchvision.models.resnet18().state_dict(), source)
    print(f"torchvision resnet18 checkpoint (random weights, 1000 classes): {source}")

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model = zoo.create("resnet18", "nnx", weights=source, num_classes=10,
                           input_size=(SIZE, SIZE), seed=args.seed)
    for w in said:
        print(f"loaded into NNX: {w.message}")

    print(f"digits: {len(x_train)} training / {len(x_test)} test images, upsampled to "
          f"{SIZE}x{SIZE}")
    model = fine_tune(model, (x_train, y_train), args.steps, args.batch_size, args.lr,
                      args.seed)
    y_nnx = logits(model, x_test)
    print(f"test accuracy: {np.mean(np.argmax(y_nnx, -1) == y_test):.3f}")

    target = out / "resnet18_digits.pt"
    converters.save(model, target, "torch", force=True)
    back = torchvision.models.resnet18(num_classes=10)
    back.load_state_dict(torch.load(target, weights_only=True), strict=True)
    with torch.no_grad():
        y_torch = back.eval()(torch.from_numpy(x_test)).numpy()
    diff = float(np.max(np.abs(y_torch - y_nnx)) / np.max(np.abs(y_nnx)))
    print(f"wrote {target}: torchvision resnet18(num_classes=10) loads it with strict=True; "
          f"max relative difference {diff:.2e} to the NNX model's logits")
    if diff > precision.tolerance("float32", kind="max_relative"):
        print("MISMATCH: torchvision's outputs differ from the NNX model's")
        return 1
    print("OK")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150, help="fine-tuning steps")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=None,
                   help="keep the checkpoints here (default: a temporary folder, removed at "
                        "the end)")
    args = p.parse_args(argv)
    missing = [name for module, name in (("sklearn", "scikit-learn"), ("torch", "torch"),
                                         ("torchvision", "torchvision"))
               if not _importable(module)]
    if missing:
        p.exit(1, f"{p.prog}: needs {' and '.join(missing)}: "
                  "pip install -e \".[torch,examples]\"\n")
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        return run(args, args.out_dir)
    with tempfile.TemporaryDirectory(prefix="finetune_resnet_") as tmp:
        code = run(args, Path(tmp))
    print("(written to a temporary folder, now removed: keep the files with --out-dir DIR)")
    return code


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
