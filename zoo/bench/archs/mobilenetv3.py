"""MobileNetV3 as a benchmark subject (`zoo.bench.spec`): timm's large model at ImageNet size
and the small one at CIFAR size (for 2 CPU cores)."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, register
from zoo.models.mobilenetv3.config import MobileNetV3Config

NAMED = MobileNetV3Config.NAMED
PRESETS: tuple[PresetFields, ...] = (
    {"name": "mobilenetv3-large-224", "batch": 64, "config": NAMED["mobilenetv3_large_100"],
     "doc": "timm mobilenetv3_large_100, ImageNet 224x224, batch 64"},
    {"name": "mobilenetv3-small-cifar", "batch": 32,
     "config": {**NAMED["mobilenetv3_small_100"], "input_size": (32, 32), "num_classes": 10},
     "doc": "timm mobilenetv3_small_100 at 32x32 (CPU), 10 classes, batch 32"},
)

register(BenchSpec("mobilenetv3", default_batch=64, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS)))
