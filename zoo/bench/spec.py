"""What the benchmark knows of each subject beside its config: one `BenchSpec` per subject.

Every subject is a module of `zoo.bench.archs`, named after it (the models know nothing of the
benchmark). A zoo architecture's module declares its default batch, named presets, the FLOPs of
its matrix products and its runs in the GPU matrix; an architecture without one gets the
defaults. A subject that is not a zoo model (the single conv-transpose layer of the published
reports) brings its own `Subjects` (how its config and its models are built). All call
`register`; the benchmark reads them through `bench_archs` and `bench_spec`, and names no
subject itself.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import canonical
import zoo
from zoo.configs import Overrides

PresetFields = dict[str, Any]  # zoo.bench.presets.Preset fields but `arch`
NativeModels = dict[str, Any]  # impl -> the library's native model (zoo.create's return)


class SubjectConfig(Protocol):
    """What the benchmark reads of a subject's config: a zoo `Config`, or a bench-only one."""

    arch: str
    LOSS: str  # "cross_entropy" or "mse" (zoo.runtime.training.LOSSES)

    @property
    def input_shape(self) -> tuple[int, ...]: ...

    @property
    def output_shape(self) -> tuple[int, ...]: ...

    def to_dict(self) -> dict[str, Any]: ...


UsefulFlops = Callable[[SubjectConfig, int, str], float | None]  # (config, batch, mode) -> FLOPs


@dataclass(frozen=True)
class MatrixRun:
    """One entry of `python -m zoo.bench matrix`: `preset` with more options (`args`).

    `methods`: with every conv-transpose method (one with `--quick`). `realistic`: a realistic
    size, the GPU's job, left out of `--quick` and run after the every-architecture entries;
    the others run first, on the `tiny` preset with `--quick`.
    """

    group: str
    preset: str
    args: tuple[str, ...] = ()
    methods: bool = False
    realistic: bool = False

    @classmethod
    def sizes(cls, presets: tuple[PresetFields, ...]) -> tuple[MatrixRun, ...]:
        """`presets` as realistic runs: forward and train, each library's default style."""
        return tuple(cls("presets", p["name"], ("--mode", "both", "--call", "default"),
                         realistic=True) for p in presets)


class Subjects(Protocol):
    """How the benchmark builds a subject's config and its models (one per implementation,
    all holding the same weights)."""

    def config(self, arch: str, overrides: Overrides, method: str) -> SubjectConfig:
        """The config of `arch` with `overrides` and the conv-transpose `method`."""
        ...

    def models(self, config: SubjectConfig, impls: tuple[str, ...], seed: int,
               dtype: str) -> NativeModels:
        """impl -> native model, from one canonical state drawn from `seed`."""
        ...


class ZooSubjects:
    """A zoo architecture: `zoo.make_config` (a `conv_method` field gets the method) and the
    models `zoo.create` gives, from one canonical state drawn once for every library."""

    def config(self, arch: str, overrides: Overrides, method: str) -> zoo.Config:
        overrides = dict(overrides)
        cls = zoo.architecture(arch).config
        if "conv_method" in {f.name for f in dataclasses.fields(cls)}:
            overrides.setdefault("conv_method", method)
        return zoo.make_config(arch, **overrides)

    def models(self, config: zoo.Config, impls: tuple[str, ...], seed: int,
               dtype: str) -> NativeModels:
        state = zoo.canonical_init(config, seed, dtype)
        return {impl: canonical.write(zoo.skeleton(config, impl, dtype), state, impl,
                                      **zoo.walk_facts(config, impl)) for impl in impls}


def _mlp_width(mlp: Any) -> int:
    """The multiply-adds per token and hidden unit of one layer's MLP (a `MLPSpec`)."""
    if mlp.kind == "moe":
        return mlp.moe.experts + mlp.moe.top_k * 3 * mlp.width
    return (3 if mlp.gated else 2) * mlp.width


def decoder_flops(config: Any, batch: int, mode: str) -> float:
    """The useful FLOPs of a decoder-only language model (a config with a `decoder` spec,
    zoo.models.decoder): multiply-adds x 2 of the q/k/v/o projections, the two attention
    products (the whole square, as computed: a mask or a sliding window does not skip), each
    layer's MLP (three matrices gated, two otherwise; a mixture: its router and the three
    matrices of each of the top-k experts a token is sent to) and the head, per token of
    `config.length`; a training step three times that."""
    s, t = config.decoder, config.length
    e, a = s.hidden_size, s.attention
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    block = 2 * t * e * (2 * q + 2 * kv) + 2 * 2 * t * t * q
    mlps = sum(2 * t * e * _mlp_width(s.mlp_of(i)) for i in range(s.num_layers))
    forward = batch * (s.num_layers * block + mlps + 2 * t * e * s.vocab_size)
    return float(forward if mode == "forward" else 3 * forward)


@dataclass(frozen=True)
class BenchSpec:
    """A subject of the benchmark.

    `default_batch`: the batch when none is given (the derived `tiny` preset takes
    min(4, it)). `presets`: named shapes (`Preset` fields but `arch`); one named "tiny"
    replaces the one derived from the config's `TINY`. `useful_flops`: the FLOPs of the model's
    matrix products, a floor every library's compiled count must reach. `matrix`: its runs in
    `python -m zoo.bench matrix` besides the every-architecture ones.
    """

    arch: str
    default_batch: int = 8
    presets: tuple[PresetFields, ...] = ()
    useful_flops: UsefulFlops | None = None
    matrix: tuple[MatrixRun, ...] = ()
    subjects: Subjects = field(default_factory=ZooSubjects)

    def flops_floor(self, config: SubjectConfig, batch: int, mode: str) -> float | None:
        """`useful_flops` at `batch` and `mode`, None when the subject declares none."""
        return self.useful_flops(config, batch, mode) if self.useful_flops else None


_SPECS: dict[str, BenchSpec] = {}


def register(spec: BenchSpec) -> BenchSpec:
    """Declare a subject's benchmark spec (a zoo architecture's, or a bench-only subject's,
    which must declare its `tiny` preset: CI runs one for every subject)."""
    if spec.arch not in zoo.ARCHS and not any(p["name"] == "tiny" for p in spec.presets):
        raise ValueError(f"benchmark subject {spec.arch!r} is no zoo architecture: declare its "
                         "'tiny' preset")
    _SPECS[spec.arch] = spec
    return spec


def _load() -> None:
    """Import `zoo.bench.archs`, whose modules register every subject (once: imports are
    cached)."""
    importlib.import_module("zoo.bench.archs")


def bench_archs() -> tuple[str, ...]:
    """Every subject: the registered architectures, then the bench-only subjects."""
    _load()
    return (*zoo.ARCHS, *(a for a in _SPECS if a not in zoo.ARCHS))


def bench_spec(arch: str) -> BenchSpec:
    """The spec of `arch` (the defaults for an architecture that declares none)."""
    _load()
    if arch in _SPECS:
        return _SPECS[arch]
    if arch in zoo.ARCHS:
        return BenchSpec(arch)
    raise ValueError(f"unknown benchmark subject {arch!r}; available: {list(bench_archs())}")
