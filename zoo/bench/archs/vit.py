"""The ViT as a benchmark subject (`zoo.bench.spec`): timm's sizes and the FLOPs of its matrix
products, the floor of the benchmark's FLOP check."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, register
from zoo.models.vit.config import ViTConfig


def useful_flops(config: ViTConfig, batch: int, mode: str) -> float:
    """Multiply-adds x 2 of the patch convolution, the projections, the attention products,
    the attention pool ("map") and the head(s); a training step adds twice that but the
    image's gradient."""
    e, t = config.width, config.seq_len
    patches = config.grid[0] * config.grid[1]
    conv = 2 * patches * config.in_channels * config.patch_size**2 * e
    block = 2 * t * e * (3 * e + e + config.mlp_hidden + config.mlp_inner) + 2 * 2 * t * t * e
    pool = 0
    if config.global_pool == "map":  # the latent's q, the patches' k and v, proj, MLP
        pool = 2 * e * (e + 2 * patches * e + e + 2 * config.pool_hidden) + 2 * 2 * patches * e
    heads = 2 if config.distilled else 1
    forward = batch * (conv + config.depth * block + pool + heads * 2 * e * config.num_classes)
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
    {"name": "dinov2-small", "batch": 32,
     "config": {**ViTConfig.NAMED["vit_small_patch14_dinov2"], "image_size": (224, 224)},
     "doc": "timm vit_small_patch14_dinov2 at 224x224 (16x16 patches, LayerScale, no head)"},
    {"name": "siglip-base", "batch": 32, "config": ViTConfig.NAMED["vit_base_patch16_siglip_224"],
     "doc": "timm vit_base_patch16_siglip_224: no class token, attention-pool head"},
)

register(BenchSpec("vit", default_batch=64, useful_flops=useful_flops, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS)))
