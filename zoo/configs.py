"""Architecture configurations: frozen, hashable, JSON-serialisable dataclasses.

A config describes an architecture in library-neutral terms (PyTorch semantics, channels-first
shapes). Every implementation of an architecture is built from the same config.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

Activation = Literal["relu", "gelu"]


class ConfigError(ValueError):
    """A configuration value or JSON document is invalid."""


@dataclass(frozen=True)
class Config:
    """Base class: validation and JSON round trips shared by every architecture config."""

    arch: ClassVar[str]
    TINY: ClassVar[dict[str, Any]] = {}

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

    def flatten_shapes(self) -> dict[str, tuple[int, ...]]:
        """Layers whose input is a flattened feature map, with that map's (C, *spatial) shape."""
        return {}

    @classmethod
    def tiny(cls, **overrides: Any) -> Self:
        """A small config of this architecture, for tests and the CI benchmark preset."""
        return cls(**{**cls.TINY, **overrides})

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


def _positive(name: str, values: tuple[int, ...]) -> None:
    if any(not isinstance(v, int) or v < 1 for v in values):
        raise ConfigError(f"{name} must be positive integers, found {values}")


@dataclass(frozen=True)
class MLPConfig(Config):
    """Three linear layers: in -> hidden[0] -> hidden[1] -> out, activation between them."""

    arch: ClassVar[str] = "mlp"
    TINY: ClassVar[dict[str, Any]] = {"in_features": 12, "hidden": (16, 8), "out_features": 5}
    in_features: int = 784
    hidden: tuple[int, int] = (512, 512)
    out_features: int = 10
    activation: Activation = "relu"

    def validate(self) -> None:
        if len(self.hidden) != 2:
            raise ConfigError(f"mlp.hidden must have 2 entries, found {self.hidden}")
        _positive("mlp sizes", (self.in_features, *self.hidden, self.out_features))
        if self.activation not in typing.get_args(Activation):
            raise ConfigError(f"mlp.activation must be relu or gelu, found {self.activation!r}")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_features,)


@dataclass(frozen=True)
class CNNConfig(Config):
    """The Flax MNIST CNN: two conv3x3 [BN] relu avgpool2 stages, dense [dropout] relu, dense."""

    arch: ClassVar[str] = "cnn"
    TINY: ClassVar[dict[str, Any]] = {"in_channels": 2, "input_size": (10, 9), "features": (4, 6),
                                      "hidden": 16, "num_classes": 5}
    in_channels: int = 1
    input_size: tuple[int, int] = (28, 28)
    features: tuple[int, int] = (32, 64)
    hidden: int = 256
    num_classes: int = 10
    batch_norm: bool = True
    dropout: float = 0.0
    bn_momentum: float = 0.99  # Flax convention: weight of the old running value.
    bn_eps: float = 1e-5

    def validate(self) -> None:
        if len(self.features) != 2 or len(self.input_size) != 2:
            raise ConfigError("cnn.features and cnn.input_size must have 2 entries each")
        _positive("cnn sizes", (self.in_channels, *self.input_size, *self.features,
                                self.hidden, self.num_classes))
        if min(self.input_size) < 4:
            raise ConfigError(f"cnn.input_size must be at least 4x4, found {self.input_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"cnn.dropout must be in [0, 1), found {self.dropout}")
        if not 0.0 <= self.bn_momentum < 1.0:
            raise ConfigError(f"cnn.bn_momentum must be in [0, 1), found {self.bn_momentum}")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.input_size)

    @property
    def feature_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the map flattened into fc1: two 2x2 average pools, floor division."""
        h, w = self.input_size
        return (self.features[1], h // 4, w // 4)

    def flatten_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"fc1": self.feature_shape}


@dataclass(frozen=True)
class Decoder3DConfig(Config):
    """A 3-D upsampling decoder: ConvTranspose3d + relu stages, then a ConvTranspose3d head.

    Stages up1..up3 map latent_channels -> channels[0] -> channels[1] -> channels[2], the head
    maps channels[2] -> out_channels. The
    per-layer tuples (kernel_size, stride, padding, output_padding, dilation) have one entry per
    conv-transpose (stages + head), with PyTorch semantics.
    """

    arch: ClassVar[str] = "decoder3d"
    TINY: ClassVar[dict[str, Any]] = {"latent_channels": 6, "latent_size": (2, 3, 2),
                                      "channels": (5, 4, 3), "out_channels": 2}
    latent_channels: int = 32
    latent_size: tuple[int, int, int] = (8, 8, 8)
    channels: tuple[int, int, int] = (16, 8, 4)
    out_channels: int = 4
    kernel_size: tuple[int, ...] = (4, 4, 4, 3)
    stride: tuple[int, ...] = (2, 2, 2, 1)
    padding: tuple[int, ...] = (1, 1, 1, 1)
    output_padding: tuple[int, ...] = (0, 0, 0, 0)
    dilation: tuple[int, ...] = (1, 1, 1, 1)
    conv_method: str = "auto"  # see zoo.layers.conv_transpose.choose_method

    def validate(self) -> None:
        if len(self.channels) != 3:
            raise ConfigError(f"decoder3d.channels needs 3 stages, found {self.channels}")
        if self.conv_method not in ("auto", "lhs_dilation", "pad", "phase"):
            raise ConfigError(f"decoder3d.conv_method must be auto, lhs_dilation, pad or phase, "
                              f"found {self.conv_method!r}")
        n = len(self.channels) + 1
        for name in ("kernel_size", "stride", "padding", "output_padding", "dilation"):
            if len(getattr(self, name)) != n:
                raise ConfigError(
                    f"decoder3d.{name} needs {n} entries (one per conv-transpose), "
                    f"found {getattr(self, name)}"
                )
        _positive("decoder3d sizes", (self.latent_channels, *self.latent_size, *self.channels,
                                      self.out_channels, *self.kernel_size, *self.stride,
                                      *self.dilation))
        for i, (s, d, op) in enumerate(zip(self.stride, self.dilation, self.output_padding,
                                           strict=True)):
            if not 0 <= op < max(s, d):
                raise ConfigError(
                    f"decoder3d layer {i}: output_padding {op} must be < max(stride, dilation)"
                )
        size = self.latent_size
        for i, layer in enumerate(self.layers()):
            size = tuple(
                (n - 1) * layer["stride"] - 2 * layer["padding"]
                + layer["dilation"] * (layer["kernel_size"] - 1) + layer["output_padding"] + 1
                for n in size
            )
            if min(size) < 1:
                raise ConfigError(f"decoder3d layer {i} would produce spatial size {size}")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.latent_channels, *self.latent_size)

    def layer_names(self) -> tuple[str, ...]:
        return (*(f"up{i + 1}" for i in range(len(self.channels))), "head")

    def layers(self) -> list[dict[str, Any]]:
        """One dict per conv-transpose: name, in/out channels and PyTorch hyper-parameters."""
        ins = (self.latent_channels, *self.channels)
        outs = (*self.channels, self.out_channels)
        return [
            dict(name=name, in_channels=i, out_channels=o, kernel_size=k, stride=s, padding=p,
                 output_padding=op, dilation=d)
            for name, i, o, k, s, p, op, d in zip(
                self.layer_names(), ins, outs, self.kernel_size, self.stride, self.padding,
                self.output_padding, self.dilation, strict=True)
        ]


CONFIGS: dict[str, type[Config]] = {c.arch: c for c in (MLPConfig, CNNConfig, Decoder3DConfig)}


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
