"""The MLP's configuration."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from zoo.configs import Config, ConfigError, positive

Activation = Literal["relu", "gelu"]


@dataclass(frozen=True)
class MLPConfig(Config):
    """Linear layers in -> hidden[0] -> ... -> hidden[-1] -> out (`layers.0` .. `layers.N`, as
    `eqx.nn.MLP` names them), the activation between them; `hidden=()` is one linear layer."""

    arch: ClassVar[str] = "mlp"
    REFERENCES: ClassVar[dict[str, str]] = {
        "PyTorch's tutorial `nn.Sequential` MLP": "tests/test_byo_checkpoint.py",
    }
    TINY: ClassVar[dict[str, Any]] = {"in_features": 12, "hidden": (16, 8), "out_features": 5}
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {  # also a depth other than the default
        "gelu-deep": {"activation": "gelu", "hidden": (8, 7, 6)}}
    LOSS: ClassVar[str] = "cross_entropy"
    in_features: int = 784
    hidden: tuple[int, ...] = (512, 512)
    out_features: int = 10
    activation: Activation = "relu"

    def validate(self) -> None:
        positive("mlp.hidden", self.hidden)
        positive("mlp sizes", (self.in_features, self.out_features))
        if self.activation not in typing.get_args(Activation):
            raise ConfigError(f"mlp.activation must be relu or gelu, found {self.activation!r}")

    @property
    def widths(self) -> tuple[int, ...]:
        """Features in and out of every layer: `layers.i` maps widths[i] -> widths[i + 1]."""
        return (self.in_features, *self.hidden, self.out_features)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_features,)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.out_features,)
