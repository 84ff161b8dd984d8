"""Architecture configurations: frozen, hashable, JSON-serialisable dataclasses.

A config describes an architecture in library-neutral terms (PyTorch semantics, channels-first
shapes). Every implementation of an architecture is built from the same config. Each
architecture's config lives in its own folder (`zoo/models/<arch>/config.py`) and declares what
tools need to know about it: input and output shapes, the task's loss, a tiny config for tests
and structural facts the converters rely on (`flatten_shape`). What the benchmark needs lives
with the benchmark (`zoo/bench/archs/<arch>.py`, a `zoo.bench.spec.BenchSpec`).
"""

from __future__ import annotations

import dataclasses
import json
import typing
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

Loss = Literal["cross_entropy", "mse", "next_token"]
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
class Axis:
    """What one axis of an input sample must satisfy: exactly `size` (weights depend on it),
    or at least `minimum`, at most `maximum` and a multiple of `multiple`."""

    name: str
    size: int | None = None
    minimum: int = 1
    maximum: int | None = None
    multiple: int = 1

    @property
    def symbol(self) -> str:
        """The axis in a shape: its size when fixed, else its name."""
        return str(self.size) if self.size is not None else self.name

    def describe(self) -> str:
        """The rule of a free axis, e.g. "H >= 32, a multiple of 32"."""
        parts = [f"{self.name} >= {self.minimum}"]
        if self.maximum is not None:
            parts = [f"{self.minimum} <= {self.name} <= {self.maximum}"]
        if self.multiple > 1:
            parts.append(f"a multiple of {self.multiple}")
        return ", ".join(parts)

    def problem(self, n: int) -> str | None:
        """Why `n` breaks the rule, or None."""
        if self.size is not None:
            return None if n == self.size else f"{self.name} must be {self.size}, not {n}"
        if n < self.minimum or (self.maximum is not None and n > self.maximum):
            return f"{self.describe().split(',')[0]}, not {n}"
        if n % self.multiple:
            return f"{self.name} must be a multiple of {self.multiple}, not {n}"
        return None


@dataclass(frozen=True)
class Padding:
    """Which config field says how an architecture's convolutions pad (the weights do not
    carry it), and its value for Flax's / TensorFlow's SAME (`same`): at stride 2 and an even
    size SAME pads (0, 1) where PyTorch pads (1, 1), so the same weights compute another
    function. An architecture declares it as `Config.PADDING`; a checkpoint whose source pads
    as SAME going into a config that does not gets a `PaddingWarning` (`padding_warning`)."""

    field: str
    same: Any = "same"


class PaddingWarning(UserWarning):
    """Weights from a source that pads as SAME go into a config that pads as PyTorch."""


def padding_warning(config: Config, source: str) -> str | None:
    """The one-line warning for weights from `source` (what pads as SAME, e.g. "a Flax
    checkpoint (Flax convolutions pad SAME by default)") going into `config`; None when
    `config` pads as SAME too or its architecture has no padding field."""
    rule = type(config).PADDING
    if rule is None or getattr(config, rule.field) == rule.same:
        return None
    flag = json.dumps({rule.field: rule.same})
    return (f"{source}, but the {config.arch} config pads as PyTorch ({json.dumps(rule.field)}: "
            f"{json.dumps(getattr(config, rule.field))}) and the weights cannot tell: if the "
            f"source model padded SAME, pass --config '{flag}' ({rule.field}="
            f"{json.dumps(rule.same)} in Python), else the outputs differ at even input sizes")


def warn_padding(config: Config, source: str, stacklevel: int = 2) -> None:
    """Warn (`PaddingWarning`, one line) when `padding_warning` has something to say."""
    message = padding_warning(config, source)
    if message is not None:
        warnings.warn(message, PaddingWarning, stacklevel=stacklevel + 1)


def axis_names(rank: int, channels: bool = True) -> tuple[str, ...]:
    """Names of a sample's axes: "C" then the spatial "D", "H", "W" (the last ones) of a
    channels-first map; "L" (length) for a token sequence; "dim i" for other axes."""
    if not channels:
        return ("L",) if rank == 1 else tuple(f"dim {i}" for i in range(rank))
    spatial = rank - 1
    return ("C", *(("D", "H", "W")[3 - spatial:] if spatial <= 3
                   else (f"dim {i}" for i in range(1, rank))))


@dataclass(frozen=True)
class Config:
    """Base class: validation and JSON round trips shared by every architecture config."""

    arch: ClassVar[str]
    TINY: ClassVar[Overrides] = {}  # overrides giving a small config (tests, CI presets)
    # cross_entropy: integer labels; mse: targets like the output; next_token: a language
    # model's shifted cross-entropy on token labels (-100 for padding), `zoo.runtime.training`
    LOSS: ClassVar[Loss] = "mse"
    VARIANTS: ClassVar[dict[str, Overrides]] = {}  # named TINY overrides tests also run
    NAMED: ClassVar[dict[str, Overrides]] = {}  # named configs ("resnet50"): overrides
    # Published weights of named models that timm's registry does not list (language models
    # on the Hub as `transformers` repositories): name -> {tag: "ORG/REPO[@REVISION]"}, the
    # first tag the default. `python -m zoo.weights.pretrained.generate` puts them in the tag table
    # beside timm's tags of every named model timm knows (`zoo.weights.pretrained`).
    HUB_REPOS: ClassVar[dict[str, dict[str, str]]] = {}
    # timm's model arguments whose config field has another name ({"embed_dim": "width"}), or
    # None for one without effect on the models the config describes: how a timm
    # config.json's `model_args` map to this config (`converters.adapters.timm_hub`).
    TIMM_ARGS: ClassVar[dict[str, str | None]] = {}
    # The outside models an architecture is tested against: reference -> the test file that
    # compares them (the model catalogue lists them; the four libraries' agreement with each
    # other is every architecture's, tests/test_equivalence.py and test_torch_reference.py).
    REFERENCES: ClassVar[dict[str, str]] = {}
    # How a checkpoint of another shape is adapted on loading (`zoo.weights.adaptation`,
    # `zoo.weights.loading`).
    ADAPTERS: ClassVar[tuple[Any, ...]] = ()
    # A sample's first axis is channels, which channels-last libraries (Flax) put last; False
    # for token sequences, laid out alike in every library.
    CHANNELS: ClassVar[bool] = True
    INPUT_DTYPE: ClassVar[str] = "float32"  # token models: "int32"
    # The overrides that give the same model without its head (`{"num_classes": 0}`; empty:
    # the architecture has no headless form): a file holding only the backbone is refused
    # with these named as the fix (`converters.checkpoints.backbone`).
    HEADLESS: ClassVar[Overrides] = {}
    # The field saying how the convolutions pad, when the architecture has one (`Padding`).
    PADDING: ClassVar[Padding | None] = None
    # A layer kind's canonical initialisation replaced for this architecture (kind name ->
    # `init(shapes, rng) -> arrays`, as `canonical.LayerKind.init`; `zoo.weights.init`).
    KIND_INITS: ClassVar[dict[str, Any]] = {}

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

    @property
    def input_axes(self) -> tuple[Axis, ...]:
        """What each axis of one input sample must satisfy, in `input_shape`'s order. The
        default pins every axis to `input_shape`; an architecture whose weights do not depend
        on a size (a global pool, a rotary position code) relaxes it here."""
        return tuple(Axis(name, size=n) for name, n in
                     zip(axis_names(len(self.input_shape), self.CHANNELS), self.input_shape,
                         strict=True))

    @property
    def backbone_prefix(self) -> str:
        """The start of the canonical keys of the model's backbone ("transformer." for
        GPT-2): transformers' base model (`GPT2Model`) saves them without it, and a file of
        those keys reads as this model without its head ("": no such prefix)."""
        return ""

    def headless(self) -> Self | None:
        """This config without its head (`HEADLESS`), None where it has no headless form or
        is headless already."""
        if not self.HEADLESS:
            return None
        out = dataclasses.replace(self, **self.HEADLESS)
        return None if out == self else out

    @property
    def ties(self) -> tuple[Any, ...]:
        """The tied arrays (`canonical.Tie(alias, source)`): one canonical key (`source`) used in
        two places, e.g. a language model's head and its token embedding. A state listing the
        alias too (transformers' `state_dict()`) loads when the two are equal."""
        return ()

    def sample_input(self, key: Any, batch: int, dtype: Any = "float32") -> Any:
        """A random batch of `input_shape` samples in the canonical layout: normal values in
        `dtype` (token models: ids drawn from their vocabulary)."""
        import jax
        import jax.numpy as jnp

        return jax.random.normal(key, (batch, *self.input_shape), jnp.float32).astype(dtype)

    def check_input(self, shape: Sequence[int], *, channels_last: bool = False,
                    batched: bool = True) -> None:
        """Raise ConfigError unless `shape` (a model's input, in its library's layout) holds
        samples that `input_axes` allow. Shapes are static, so a model calls this at trace
        time. `channels_last`: the library puts the channel axis last (ignored for
        architectures without one, `CHANNELS = False`)."""
        shape = tuple(int(d) for d in shape)
        axes = self.input_axes
        moved = channels_last and self.CHANNELS and len(axes) > 1
        if len(shape) != len(axes) + batched:
            want = [a.symbol for a in axes]
            if moved:
                want = [*want[1:], want[0]]
            layout = ("N", *want) if batched else want
            raise ConfigError(f"{self.arch} expects {'batched' if batched else 'per-sample'} "
                              f"inputs shaped ({', '.join(layout)}), got {shape}")
        sample = shape[1:] if batched else shape
        if moved:
            sample = (sample[-1], *sample[:-1])
        problems = [p for a, n in zip(axes, sample, strict=True) if (p := a.problem(n))]
        if problems:
            free = [a.describe() for a in axes if a.size is None]
            contract = "(" + ", ".join(a.symbol for a in axes) + ")"
            rules = f" ({'; '.join(free)})" if free else ""
            raise ConfigError(f"{self.arch} expects {contract} per sample{rules}, got {sample}"
                              + (f": {'; '.join(problems)}" if free else ""))

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


def named_models() -> dict[str, tuple[str, dict[str, Any]]]:
    """Every named model: name -> (architecture, config overrides)."""
    table: dict[str, tuple[str, dict[str, Any]]] = {}
    for arch, cls in CONFIGS.items():
        for name, overrides in cls.NAMED.items():
            if name in table or name in CONFIGS:
                raise ConfigError(f"model name {name!r} of {arch} is already taken")
            table[name] = (arch, overrides)
    return table


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
