"""EfficientNet as a benchmark subject (`zoo.bench.spec`): timm's B0 at ImageNet size and at
CIFAR size (the small one for 2 CPU cores), and a CI preset."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, register
from zoo.models.efficientnet.config import EfficientNetConfig

B0 = EfficientNetConfig.NAMED["efficientnet_b0"]
# CI: the tests' tiny config at 16 channels. At 8 the layer widths are so small that the
# elementwise work XLA duplicates around Equinox's layout transposes (BatchNorm, SiLU) is 1.1%
# of its compiled training count, over the fairness check's 1%; 0.6% at 16, 0.1% at B0's
# widths (the same programs otherwise: forward counts are equal).
TINY = {**EfficientNetConfig.TINY, "stem_size": 16, "num_features": 32,
        "arch_def": (("ds_r1_k3_s1_e1_c16_se0.25",), ("ir_r2_k5_s2_e2_c16_se0.25",))}
SIZES: tuple[PresetFields, ...] = (
    {"name": "efficientnet-b0-224", "batch": 64, "config": B0,
     "doc": "timm efficientnet_b0, ImageNet 224x224, batch 64"},
    {"name": "efficientnet-b0-cifar", "batch": 32,
     "config": {**B0, "input_size": (32, 32), "num_classes": 10},
     "doc": "timm efficientnet_b0 at 32x32 (CPU), 10 classes, batch 32"},
)
PRESETS: tuple[PresetFields, ...] = (
    {"name": "tiny", "batch": 4, "config": TINY,
     "doc": "CI: the efficientnet tiny config at 16 channels, batch 4"}, *SIZES)

register(BenchSpec("efficientnet", default_batch=64, presets=PRESETS,
                   matrix=MatrixRun.sizes(SIZES)))
