"""ResNet as a benchmark subject (`zoo.bench.spec`): the realistic sizes of the GPU matrix."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, register
from zoo.models.resnet.config import ResNetConfig

PRESETS: tuple[PresetFields, ...] = (
    {"name": "resnet18-224", "batch": 64, "doc": "ResNet-18, ImageNet 224x224, batch 64"},
    {"name": "resnet18-224-b256", "batch": 256, "doc": "ResNet-18, ImageNet 224x224, batch 256"},
    {"name": "resnet18-cifar", "batch": 512,
     "config": {"stem": "cifar", "input_size": (32, 32), "num_classes": 10},
     "doc": "ResNet-18 with the CIFAR stem, 32x32, batch 512"},
    {"name": "resnet50-224", "batch": 64, "config": ResNetConfig.NAMED["resnet50"],
     "doc": "ResNet-50, ImageNet 224x224, batch 64"},
)

register(BenchSpec("resnet", default_batch=64, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS)))
