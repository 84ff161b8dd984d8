"""Named benchmark shapes: data, not code.

A preset names an architecture (a zoo architecture, or "convt" for a single conv-transpose
layer), its configuration, the batch size, dtype and the modes it is meant for. `tiny` exists for
every registered architecture (CI: its config's `TINY`, batch min(4, `DEFAULT_BATCH`)), read
live from the registry, and so do the realistic presets an architecture declares in its config's
`BENCH` (e.g. `resnet18-224`, `unet3d-128`); `cpu` holds the moderate sizes recorded on CPU in
bench/results/cpu/; `convt-256` and `convt-wgrad` are the published conv-transpose reports'
shapes (docs/benchmarks.md states how they were read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import zoo

LAYER_ARCH = "convt"  # a single 3-D conv-transpose layer (zoo.bench.layers)
MODES: tuple[str, ...] = ("forward", "train")


class Live(Sequence):
    """A tuple recomputed at every use (it follows the architecture registry)."""

    def __init__(self, make: Callable[[], tuple]) -> None:
        self._make = make

    def __getitem__(self, i: Any) -> Any:
        return self._make()[i]

    def __len__(self) -> int:
        return len(self._make())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._make())

    def __repr__(self) -> str:
        return repr(self._make())


ARCHS: Sequence[str] = Live(lambda: (*zoo.ARCHS, LAYER_ARCH))


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


def tiny_presets() -> tuple[Preset, ...]:
    """One `tiny` preset per registered architecture: its `TINY` config (shared with the
    tests), batch min(4, its `DEFAULT_BATCH`)."""
    out = []
    for arch in zoo.ARCHS:
        cls = zoo.architecture(arch).config
        batch = min(4, cls.DEFAULT_BATCH)
        out.append(Preset("tiny", arch, batch, dict(cls.TINY),
                          doc=f"CI: the {arch} tiny config, batch {batch}"))
    return tuple(out)


def declared_presets() -> tuple[Preset, ...]:
    """The presets every registered architecture declares in its config's `BENCH`."""
    return tuple(Preset(arch=arch, **fields) for arch in zoo.ARCHS
                 for fields in zoo.architecture(arch).config.BENCH)


_FIXED: tuple[Preset, ...] = (
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

PRESETS: Sequence[Preset] = Live(lambda: (*tiny_presets(), *_FIXED, *declared_presets()))


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


class _DefaultBatch(Mapping):
    """The benchmark batch per architecture: its config's `DEFAULT_BATCH` (1 for "convt")."""

    def __getitem__(self, arch: str) -> int:
        return 1 if arch == LAYER_ARCH else zoo.architecture(arch).config.DEFAULT_BATCH

    def __iter__(self) -> Iterator[str]:
        return iter(ARCHS)

    def __len__(self) -> int:
        return len(ARCHS)


DEFAULT_BATCH: Mapping[str, int] = _DefaultBatch()
