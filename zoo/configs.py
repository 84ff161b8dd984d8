"""Architecture configurations: frozen, hashable, JSON-serialisable dataclasses.

A config describes an architecture in library-neutral terms (PyTorch semantics, channels-first
shapes). Every implementation of an architecture is built from the same config. Each
architecture's config lives in its own folder (`zoo/models/<arch>/config.py`) and declares what
tools need to know about it: input and output shapes, the task's loss, a tiny config for tests
and structural facts the converters rely on (`flatten_shape`). What the benchmark needs lives
beside it, in the folder's `bench.py` (`zoo.bench.spec.BenchSpec`).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

Loss = Literal["cross_entropy", "mse"]
Overrides = dict[str, Any]  # config field name -> value


class ConfigError(ValueError):
    """A configuration value or JSON document is invalid."""


def check_keys(cls: type[Config], keys: Iterable[str]) -> None:
    """Refuse keys that are not fields of `cls`, listing the valid ones (API and CLI alike)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(keys) - known)
    if unknown:
        raise ConfigError(f"unknown {cls.arch} config keys {unknown}; valid keys: {sorted(known)}")


@dataclass(frozen=True)
class Config:
    """Base class: validation and JSON round trips shared by every architecture config."""

    arch: ClassVar[str]
    TINY: ClassVar[Overrides] = {}  # overrides giving a small config (tests, CI presets)
    LOSS: ClassVar[Loss] = "mse"  # cross_entropy: integer labels; mse: targets like the output
    VARIANTS: ClassVar[dict[str, Overrides]] = {}  # named TINY overrides tests also run
    NAMED: ClassVar[dict[str, Overrides]] = {}  # named configs ("resnet50"): overrides
    # How a checkpoint of another shape is adapted on loading (`zoo.adapters`, `zoo.weights`).
    ADAPTERS: ClassVar[tuple[Any, ...]] = ()

    def __new__(cls, *args: Any, **fields: Any) -> Self:
        check_keys(cls, fields)  # before the dataclass __init__'s bare TypeError
        return super().__new__(cls)

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value = tuples(getattr(self, field.name))  # JSON gives lists; configs hold tuples
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

    def check_input(self, shape: Sequence[int], *, channels_last: bool = False,
                    batched: bool = True) -> None:
        """Raise ConfigError unless `shape` (a model's input, in its library's layout) holds
        samples of `input_shape`. Shapes are static, so a model calls this at trace time."""
        shape = tuple(int(d) for d in shape)
        want = self.input_shape
        if channels_last and len(want) > 1:
            want = (*want[1:], want[0])
        if len(shape) != len(want) + batched:
            layout = ("N", *want) if batched else want
            raise ConfigError(f"{self.arch} expects {'batched' if batched else 'per-sample'} "
                              f"inputs shaped ({', '.join(map(str, layout))}), got {shape}")
        sample = shape[1:] if batched else shape
        if sample != want:
            if channels_last and len(sample) > 1:
                sample = (sample[-1], *sample[:-1])
            raise ConfigError(f"{self.arch} expects {self.input_shape} per sample, got {sample}")

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
        return cls(**data)


def tuples(value: Any) -> Any:
    """`value` with every list, at any depth, made a tuple (JSON gives lists; configs hash)."""
    if isinstance(value, list | tuple):
        return tuple(tuples(v) for v in value)
    return value


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
