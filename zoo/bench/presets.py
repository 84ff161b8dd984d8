"""Named benchmark shapes: data, not code.

A preset names an architecture (a zoo architecture, or "convt" for a single conv-transpose
layer), its configuration, the batch size, dtype and the modes it is meant for. `tiny` exists for
every architecture (CI); `cpu` holds the moderate sizes recorded on CPU in bench/results/cpu/;
`convt-256` and `convt-wgrad` are the published conv-transpose reports' shapes (docs/benchmarks.md
states how they were read).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import zoo

LAYER_ARCH = "convt"  # a single 3-D conv-transpose layer (zoo.bench.layers)
ARCHS: tuple[str, ...] = (*zoo.ARCHS, LAYER_ARCH)
MODES: tuple[str, ...] = ("forward", "train")


@dataclass(frozen=True)
class Preset:
    """One named benchmark shape.

    `config`: overrides of the architecture's config (`zoo.make_config(arch, **config)`), or for
    `arch="convt"` the fields of `zoo.bench.layers.ConvTSpec`. `batch`: the leading axis N.
    `modes`: "forward", "train" or both. `doc`: one line for `python -m zoo.bench presets`.
    """

    name: str
    arch: str
    batch: int
    config: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    modes: tuple[str, ...] = MODES
    doc: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_TINY_CONVT = dict(in_channels=4, out_channels=4, spatial=(4, 4, 4), kernel_size=3, stride=2,
                   padding=1, output_padding=1)

def _tiny(arch: str, fallback: dict[str, Any]) -> dict[str, Any]:
    """The architecture's own tiny config (`Config.TINY`, shared with the tests) if it has one."""
    from zoo.configs import CONFIGS

    return dict(getattr(CONFIGS[arch], "TINY", None) or fallback)


PRESETS: tuple[Preset, ...] = (
    Preset("tiny", "mlp", 4, _tiny("mlp", dict(in_features=16, hidden=(32, 32), out_features=4)),
           doc="CI: the MLP's tiny config, batch 4"),
    Preset("tiny", "cnn", 4, _tiny("cnn", dict(in_channels=1, input_size=(8, 8), features=(4, 8),
                                               hidden=16, num_classes=4)),
           doc="CI: the CNN's tiny config, batch 4"),
    Preset("tiny", "decoder3d", 2, _tiny("decoder3d", dict(
        latent_channels=4, latent_size=(1, 1, 1), channels=(4, 4, 2), out_channels=2)),
        doc="CI: the decoder's tiny config, batch 2"),
    Preset("tiny", LAYER_ARCH, 2, _TINY_CONVT,
           doc="CI: one 4->4 conv-transpose, k3 s2 p1 op1, on 4^3, batch 2"),
    Preset("cpu", "mlp", 128, {}, doc="default MLP (784-512-512-10), batch 128"),
    Preset("cpu", "cnn", 64, {}, doc="default CNN (MNIST 28x28, BatchNorm), batch 64"),
    Preset("cpu", "decoder3d", 2, {},
           doc="default decoder (32x8^3 latent -> 4x64^3), batch 2"),
    Preset("cpu", LAYER_ARCH, 1, dict(in_channels=16, out_channels=1, spatial=(16, 16, 16),
                                      kernel_size=3, stride=2, padding=1, output_padding=1),
           doc="a CPU-sized convt-wgrad: 16->1, k3 s2 p1 op1 on 16^3, batch 1"),
    Preset("convt-256", LAYER_ARCH, 4,
           dict(in_channels=4, out_channels=4, spatial=(256, 256, 256), kernel_size=3, stride=1,
                padding=1, output_padding=0),
           doc="published: input (4, 4, 256, 256, 256) NCDHW, 4->4, k3 s1 p1 (1 GiB f32 tensor)"),
    Preset("convt-256-cpu", LAYER_ARCH, 1,
           dict(in_channels=4, out_channels=4, spatial=(64, 64, 64), kernel_size=3, stride=1,
                padding=1, output_padding=0),
           doc="CPU-sized convt-256: input (1, 4, 64, 64, 64), 4->4, k3 s1 p1"),
    Preset("convt-wgrad-cpu", LAYER_ARCH, 1,
           dict(in_channels=64, out_channels=1, spatial=(32, 32, 16), kernel_size=3, stride=2,
                padding=1, output_padding=1),
           doc="CPU-sized convt-wgrad: 64->1, k3 s2 p1 op1 on 32x32x16, float32 (bfloat16 convs "
               "on XLA CPU: 5.8 s per training step, too slow to record)"),
    Preset("decoder3d-train", "decoder3d", 2, {}, modes=("train",),
           doc="the decoder train step: default config (32x8^3 latent -> 4x64^3), batch 2"),
    Preset("convt-wgrad", LAYER_ARCH, 1,
           dict(in_channels=64, out_channels=1, spatial=(64, 64, 32), kernel_size=3, stride=2,
                padding=1, output_padding=1),
           dtype="bfloat16", modes=("train",),
           doc="published: bf16 weight gradient, 64->1, k3 s2 p1 op1, per-sample input "
               "64x64x64x32 read as (C=64, D=64, H=64, W=32)"),
)


class PresetError(ValueError):
    """An unknown preset, or one that does not fit the architecture asked for."""


def find_preset(name: str, arch: str | None = None) -> Preset:
    """The preset `name` of `arch`; `arch` may be omitted when only one architecture has it."""
    matches = [p for p in PRESETS if p.name == name and (arch is None or p.arch == arch)]
    if len(matches) == 1:
        return matches[0]
    names = sorted({p.name for p in PRESETS if arch is None or p.arch == arch})
    if not matches:
        where = f" for {arch!r}" if arch else ""
        raise PresetError(f"no preset {name!r}{where}; available: {names}")
    raise PresetError(f"preset {name!r} exists for {sorted(p.arch for p in matches)}: "
                      "name the architecture")


DEFAULT_BATCH: dict[str, int] = {"mlp": 128, "cnn": 64, "decoder3d": 2, LAYER_ARCH: 1}
