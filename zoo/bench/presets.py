"""Named benchmark shapes: data, not code.

A preset names a benchmark subject (`zoo.bench.spec.bench_archs`: the zoo's architectures and
the bench-only subjects), its configuration, the batch size, dtype and the modes it is meant
for. Every subject declares its presets in its `BenchSpec` (read live: `cpu` the moderate sizes
recorded on CPU in bench/results/cpu/, the realistic sizes of the GPU matrix, the published
conv-transpose reports' shapes); `tiny` exists for every subject (CI: its config's `TINY`, batch
min(4, its default batch), unless the spec declares its own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import zoo
from zoo.bench.spec import bench_archs, bench_spec

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


ARCHS: Sequence[str] = Live(bench_archs)


@dataclass(frozen=True)
class Preset:
    """One named benchmark shape.

    `config`: overrides of the subject's config (`zoo.make_config(arch, **config)` for a zoo
    architecture; see its `BenchSpec.subjects` otherwise). `batch`: the leading axis N.
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


def tiny_presets() -> tuple[Preset, ...]:
    """A `tiny` preset per subject that declares none: its config's `TINY` (shared with the
    tests), batch min(4, its default batch)."""
    out = []
    for arch in bench_archs():
        spec = bench_spec(arch)
        if any(p["name"] == "tiny" for p in spec.presets):
            continue
        batch = min(4, spec.default_batch)
        out.append(Preset("tiny", arch, batch, dict(zoo.architecture(arch).config.TINY),
                          doc=f"CI: the {arch} tiny config, batch {batch}"))
    return tuple(out)


def declared_presets() -> tuple[Preset, ...]:
    """The presets every subject declares in its `BenchSpec`."""
    return tuple(Preset(arch=arch, **fields) for arch in bench_archs()
                 for fields in bench_spec(arch).presets)


PRESETS: Sequence[Preset] = Live(lambda: (*tiny_presets(), *declared_presets()))


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
    """The benchmark batch per subject: its `BenchSpec.default_batch`."""

    def __getitem__(self, arch: str) -> int:
        return bench_spec(arch).default_batch

    def __iter__(self) -> Iterator[str]:
        return iter(ARCHS)

    def __len__(self) -> int:
        return len(ARCHS)


DEFAULT_BATCH: Mapping[str, int] = _DefaultBatch()
