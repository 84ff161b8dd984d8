"""The MLP's configuration."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from zoo.configs import Config, ConfigError, positive

Activation = Literal["relu", "gelu"]


@dataclass(frozen=True)
class MLPConfig(Config):
    """Three linear layers: in -> hidden[0] -> hidden[1] -> out, activation between them."""

    arch: ClassVar[str] = "mlp"
    TINY: ClassVar[dict[str, Any]] = {"in_features": 12, "hidden": (16, 8), "out_features": 5}
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {"gelu": {"activation": "gelu"}}
    DEFAULT_BATCH: ClassVar[int] = 128
    LOSS: ClassVar[str] = "cross_entropy"
    in_features: int = 784
    hidden: tuple[int, int] = (512, 512)
    out_features: int = 10
    activation: Activation = "relu"

    def validate(self) -> None:
        if len(self.hidden) != 2:
            raise ConfigError(f"mlp.hidden must have 2 entries, found {self.hidden}")
        positive("mlp sizes", (self.in_features, *self.hidden, self.out_features))
        if self.activation not in typing.get_args(Activation):
            raise ConfigError(f"mlp.activation must be relu or gelu, found {self.activation!r}")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_features,)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.out_features,)
