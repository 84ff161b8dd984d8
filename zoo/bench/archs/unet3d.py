"""The 3-D U-Net as a benchmark subject (`zoo.bench.spec`): the realistic sizes of the GPU
matrix."""

from zoo.bench.spec import BenchSpec, MatrixRun, PresetFields, register

PRESETS: tuple[PresetFields, ...] = (
    {"name": "unet3d-64", "batch": 2, "config": {"input_size": (64, 64, 64)},
     "doc": "3-D U-Net, widths 16-32-64-128, 1x64^3 -> 2x64^3, batch 2"},
    {"name": "unet3d-128", "batch": 1, "config": {"input_size": (128, 128, 128)},
     "doc": "3-D U-Net, widths 16-32-64-128, 1x128^3 -> 2x128^3, batch 1"},
)

register(BenchSpec("unet3d", default_batch=2, presets=PRESETS,
                   matrix=MatrixRun.sizes(PRESETS)))
