"""ConvNeXt as a benchmark subject (`zoo.bench.spec`): timm's sizes at ImageNet resolution (the
GPU matrix) and a small one for CPUs."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, register
from zoo.models.convnext.config import ConvNeXtConfig

PRESETS: tuple[PresetFields, ...] = (
    {"name": "convnext-tiny-224", "batch": 64, "config": ConvNeXtConfig.NAMED["convnext_tiny"],
     "doc": "timm convnext_tiny, ImageNet 224x224, batch 64"},
    {"name": "convnextv2-tiny-224", "batch": 64,
     "config": ConvNeXtConfig.NAMED["convnextv2_tiny"],
     "doc": "timm convnextv2_tiny (GRN), ImageNet 224x224, batch 64"},
    {"name": "convnext-atto-cifar", "batch": 32,
     "config": {**ConvNeXtConfig.NAMED["convnext_atto"], "input_size": (32, 32),
                "num_classes": 10},
     "doc": "timm convnext_atto at CIFAR's 32x32 (CPU), 10 classes, batch 32"},
)

register(BenchSpec("convnext", default_batch=64, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS)))
