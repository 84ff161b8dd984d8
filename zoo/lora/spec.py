"""What an adapter is: its hyper-parameters, its layers and its factors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """The hyper-parameters of an adapter, as peft's `LoraConfig` names them."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    dropout: float = 0.0
    use_rslora: bool = False

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


@dataclasses.dataclass(frozen=True)
class Target:
    """One adapted layer: canonical name, native path, sizes and weight layout."""

    name: str
    path: tuple[str, ...]
    in_features: int
    out_features: int
    fan_in_fan_out: bool


@dataclasses.dataclass
class Adapter:
    """What an adapter is outside a model (what peft's folder holds): the spec, the factors
    by canonical layer name, canonical layout (`A` `(rank, in)`, `B` `(out, rank)`), and
    whether the adapted weights are `(in, out)` (`fan_in_fan_out`)."""

    spec: LoraSpec
    factors: dict[str, tuple[np.ndarray, np.ndarray]]
    fan_in_fan_out: bool = False
