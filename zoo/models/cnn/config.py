"""The CNN's configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zoo.configs import Config, ConfigError, positive


@dataclass(frozen=True)
class CNNConfig(Config):
    """The Flax MNIST CNN: one conv3x3 [BN] relu avgpool2 stage per entry of `features` (`convs.i`,
    `bns.i`), then dense `fc1` [dropout] relu, dense `fc2`."""

    arch: ClassVar[str] = "cnn"
    REFERENCES: ClassVar[dict[str, str]] = {
        "Flax's Linen and NNX MNIST tutorial models": "tests/test_flax_and_npz_files.py",
    }
    TINY: ClassVar[dict[str, Any]] = {"in_channels": 2, "input_size": (10, 9), "features": (4, 6),
                                      "hidden": 16, "num_classes": 5}
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {  # also a depth other than the default
        "nobn-deep": {"batch_norm": False, "features": (4, 6, 5)}}
    LOSS: ClassVar[str] = "cross_entropy"
    in_channels: int = 1
    input_size: tuple[int, int] = (28, 28)
    features: tuple[int, ...] = (32, 64)
    hidden: int = 256
    num_classes: int = 10
    batch_norm: bool = True
    dropout: float = 0.0
    bn_momentum: float = 0.99  # Flax convention: weight of the old running value.
    bn_eps: float = 1e-5

    def validate(self) -> None:
        if not self.features:
            raise ConfigError("cnn.features needs at least one stage, found ()")
        positive("cnn.features", self.features)
        positive("cnn sizes", (self.in_channels, *self.input_size, self.hidden, self.num_classes))
        n, least = len(self.features), 2 ** len(self.features)
        if min(self.input_size) < least:
            raise ConfigError(f"cnn.input_size must be at least {least}x{least} for {n} stage(s) "
                              f"(each halves it), found {self.input_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"cnn.dropout must be in [0, 1), found {self.dropout}")
        if not 0.0 <= self.bn_momentum < 1.0:
            raise ConfigError(f"cnn.bn_momentum must be in [0, 1), found {self.bn_momentum}")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.input_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.num_classes,)

    @property
    def flatten_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the map flattened into fc1: a 2x2 average pool per stage, each flooring."""
        scale = 2 ** len(self.features)
        return (self.features[-1], *(s // scale for s in self.input_size))
