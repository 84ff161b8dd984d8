"""Swin as a benchmark subject (`zoo.bench.spec`): timm's sizes and the FLOPs of its matrix
products, the floor of the benchmark's FLOP check."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, register
from zoo.models.swin.config import SwinConfig, padded


def useful_flops(config: SwinConfig, batch: int, mode: str) -> float:
    """Multiply-adds x 2 of the patch convolution, each block's projections (over the padded
    windows), window attention and MLP, the patch merging and the head; a training step adds
    twice that but the image's gradient."""
    h, w = config.grid
    conv = 2 * h * w * config.in_channels * config.patch_size ** 2 * config.embed_dim
    total = conv
    for i, depth in enumerate(config.depths):
        c, (rh, rw) = config.stage_dim(i), config.resolution(i)
        if i:
            total += 2 * rh * rw * 4 * config.stage_dim(i - 1) * c
        window = config.window(i)
        ph, pw = padded((rh, rw), window)
        area = window[0] * window[1]
        block = (2 * ph * pw * c * 4 * c + 2 * 2 * ph * pw * area * c
                 + 2 * 2 * rh * rw * c * config.mlp_hidden(i))
        total += depth * block
    total += 2 * config.num_features * config.num_classes
    forward = batch * total
    return float(forward if mode == "forward" else 3 * forward - batch * conv)


PRESETS: tuple[PresetFields, ...] = (
    {"name": "swin-tiny", "batch": 64,
     "doc": "timm swin_tiny_patch4_window7_224: 224x224, patch 4, width 96, depths 2-2-6-2"},
    {"name": "swin-cifar", "batch": 32,
     "config": {"image_size": (32, 32), "patch_size": 2, "embed_dim": 48, "depths": (2, 2, 2),
                "num_heads": (3, 6, 12), "window_size": 4, "num_classes": 10},
     "doc": "CIFAR-sized (CPU): 32x32, patch 2, width 48, depths 2-2-2, window 4"},
)

register(BenchSpec("swin", default_batch=64, useful_flops=useful_flops, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS)))
