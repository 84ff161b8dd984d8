"""The ViT as a benchmark subject (`zoo.bench.spec`): timm's sizes and the FLOPs of its matrix
products, the floor of the benchmark's FLOP check."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, register
from zoo.models.vit.config import ViTConfig


def useful_flops(config: ViTConfig, batch: int, mode: str) -> float:
    """Multiply-adds x 2 of the patch convolution, the projections, the attention products and
    the head; a training step adds twice that but the image's gradient."""
    e, m, t = config.width, config.mlp_hidden, config.seq_len
    patches = config.grid[0] * config.grid[1]
    conv = 2 * patches * config.in_channels * config.patch_size**2 * e
    block = 2 * t * e * (3 * e + e + 2 * m) + 2 * 2 * t * t * e
    forward = batch * (conv + config.depth * block + 2 * e * config.num_classes)
    return float(forward if mode == "forward" else 3 * forward - batch * conv)


PRESETS: tuple[PresetFields, ...] = (
    {"name": "vit-tiny", "batch": 64,
     "doc": "timm vit_tiny_patch16_224: 224x224, patch 16, width 192, depth 12, 3 heads"},
    {"name": "vit-tiny-b256", "batch": 256, "doc": "timm vit_tiny_patch16_224 at batch 256"},
    {"name": "vit-b16", "batch": 64, "config": ViTConfig.NAMED["vit_base_patch16_224"],
     "doc": "ViT-B/16, timm vit_base_patch16_224: 224x224, width 768, depth 12, 12 heads, "
            "batch 64"},
    {"name": "vit-cifar", "batch": 32,
     "config": {"image_size": (32, 32), "patch_size": 4, "width": 96, "depth": 4,
                "num_heads": 3, "num_classes": 10},
     "doc": "CIFAR-sized (CPU): 32x32, patch 4 (64 patches), width 96, depth 4, 3 heads"},
)

register(BenchSpec("vit", default_batch=64, useful_flops=useful_flops, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS)))
