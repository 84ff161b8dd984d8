"""Architecture configurations: frozen, hashable, JSON-serialisable dataclasses.

A config describes an architecture in library-neutral terms (PyTorch semantics, channels-first
shapes). Every implementation of an architecture is built from the same config. Each
architecture's config lives in its own folder (`zoo/models/<arch>/config.py`) and declares what
tools need to know about it: input and output shapes, the task's loss, a tiny config for tests,
a default benchmark batch, and structural facts the converters rely on (`flatten_shape`).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

from zoo.layers.conv_transpose import output_shape, torch_padding

Loss = Literal["cross_entropy", "mse"]


class ConfigError(ValueError):
    """A configuration value or JSON document is invalid."""


@dataclass(frozen=True)
class Config:
    """Base class: validation and JSON round trips shared by every architecture config."""

    arch: ClassVar[str]
    TINY: ClassVar[dict[str, Any]] = {}  # overrides giving a small config (tests, CI presets)
    DEFAULT_BATCH: ClassVar[int] = 8  # the benchmark's batch when none is given
    LOSS: ClassVar[Loss] = "mse"  # cross_entropy: integer labels; mse: targets like the output
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {}  # named TINY overrides tests also run
    NAMED: ClassVar[dict[str, dict[str, Any]]] = {}  # named configs ("resnet50"): overrides
    # Benchmark presets the architecture declares (zoo.bench.presets.Preset fields but `arch`):
    # {"name", "batch", "config" (overrides), optional "dtype", "modes", "doc"}.
    BENCH: ClassVar[tuple[dict[str, Any], ...]] = ()

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, list):  # JSON gives lists; configs hold tuples so they hash.
                value = tuple(value)
                object.__setattr__(self, field.name, value)
            if not _matches(value, hints[field.name]):
                shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
                raise ConfigError(f"{type(self).__name__}.{field.name}: expected "
                                  f"{_describe(hints[field.name])}, found {shown}")
            if hints[field.name] is float:
                object.__setattr__(self, field.name, float(value))
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError on inconsistent values."""

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input sample, channels-first (PyTorch layout, no batch axis)."""
        raise NotImplementedError

    @property
    def output_shape(self) -> tuple[int, ...]:
        """Shape of one output sample, channels-first (no batch axis)."""
        raise NotImplementedError

    @property
    def flatten_shape(self) -> tuple[int, ...] | None:
        """(C, *spatial) of the feature map the model flattens into its first linear layer with
        that many inputs (Flax flattens channels-last: the converters permute that layer)."""
        return None

    def useful_flops(self, batch: int, mode: str) -> float | None:
        """FLOPs of the model's matrix products at `batch` ("forward" or a "train" step), a
        floor every library's compiled count must reach (the benchmark's FLOP check then
        accepts differences above it as XLA's accounting); None when not declared."""
        return None

    def conv_transposes(self) -> list[ConvTransposeSpec]:
        """The model's conv-transpose layers with their input sizes, in order (the benchmark's
        method choice and roofline read them)."""
        return []

    @classmethod
    def tiny(cls, **overrides: Any) -> Self:
        """A small config of this architecture, for tests and the CI benchmark preset."""
        return cls(**{**cls.TINY, **overrides})

    @classmethod
    def named(cls, name: str, **overrides: Any) -> Self:
        """A named config of this architecture (its `NAMED` overrides, e.g. "resnet50")."""
        if name not in cls.NAMED:
            raise ConfigError(f"{cls.arch} has no named config {name!r}; available: "
                              f"{sorted(cls.NAMED)}")
        return cls(**{**cls.NAMED[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        return {"arch": self.arch, **dataclasses.asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        data = dict(data)
        arch = data.pop("arch", cls.arch)
        if arch != cls.arch:
            raise ConfigError(f"config is for architecture {arch!r}, expected {cls.arch!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown {cls.arch} config keys {unknown}; valid keys: {sorted(known)}"
            )
        return cls(**data)


def _matches(value: Any, hint: Any) -> bool:
    """Whether `value` has the type `hint` (int, float, bool, str, Literal, tuple[...])."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return len(value) == len(args) and all(map(_matches, value, args))
    if hint is float:  # JSON writes 1.0 as 1
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list, each item {_describe(args[0])}"
        return f"a list of {len(args)} ({', '.join(map(_describe, args))})"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        hint, str(hint))


def positive(name: str, values: tuple[int, ...]) -> None:
    if any(not isinstance(v, int) or v < 1 for v in values):
        raise ConfigError(f"{name} must be positive integers, found {values}")


@dataclass(frozen=True)
class ConvTransposeSpec:
    """One conv-transpose layer: channels, PyTorch hyper-parameters (one int for every spatial
    dim) and the spatial size of its input."""

    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int
    padding: int
    output_padding: int
    dilation: int
    input_size: tuple[int, ...]
    name: str = ""

    @property
    def per_dim(self) -> tuple[tuple[int, ...], ...]:
        """(kernel_size, stride, padding, output_padding, dilation), each one entry per dim."""
        n = len(self.input_size)
        return tuple((v,) * n for v in (self.kernel_size, self.stride, self.padding,
                                         self.output_padding, self.dilation))

    @property
    def output_size(self) -> tuple[int, ...]:
        """PyTorch's (i - 1)s - 2p + d(k - 1) + op + 1 per dim (ValueError if < 1)."""
        return output_shape(self.input_size, *self.per_dim)

    @property
    def flax_padding(self) -> tuple[tuple[int, int], ...]:
        """The explicit (low, high) padding pairs of the Flax layer."""
        return torch_padding(*self.per_dim)


CONFIGS: dict[str, type[Config]] = {}  # filled by zoo.registry.register


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build the config named by data['arch']."""
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a JSON object, found {type(data).__name__}")
    arch = data.get("arch")
    if not isinstance(arch, str):
        raise ConfigError(f"config field 'arch' must be an architecture name, found {arch!r}")
    if arch not in CONFIGS:
        raise ConfigError(f"unknown architecture {arch!r}; known: {sorted(CONFIGS)}")
    return CONFIGS[arch].from_dict(data)
