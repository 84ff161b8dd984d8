"""Trainable against frozen parameters: a declared split every library and `zoo.runtime.fast` read.

    step = zoo.runtime.fast.train_step(model, impl, optax.adam(1e-3), loss,
    trainable=Partition.only( "lm_head.*"))                                   # train only the head
    Partition.freezing_blocks(2)                        # freeze the first 2 blocks
    zoo.lora.TRAINABLE                                  # the LoRA factors only

A partition is a predicate on each parameter's dotted name: its native path, list items as
`.N` in every library (`transformer.h.0.attn.c_attn.weight` in Equinox, `...c_attn.kernel` in
Flax), matched with `fnmatch` patterns. Each library splits its parameters its own way
(`Interface.partition`: Equinox's two-way `eqx.partition`, NNX's `nnx.split_state` with a
filter, Linen's parameter dict split the same two ways); `zoo.runtime.fast` then differentiates and
updates the trainable part only and passes the frozen part to the step as an argument.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from typing import Any

__all__ = ["Partition", "trainable_names"]

_BLOCK = re.compile(r"\.(\d+)\.")


@dataclasses.dataclass(frozen=True)
class Partition:
    """Which parameters train: those matching `train` (all when empty) and not `freeze`, with
    names under the first `frozen_blocks` numbered blocks (`h.0`, `layers.1`) frozen too."""

    train: tuple[str, ...] = ()
    freeze: tuple[str, ...] = ()
    frozen_blocks: int = 0

    @classmethod
    def only(cls, *patterns: str) -> Partition:
        """Train the parameters matching any of `patterns`, freeze the rest."""
        return cls(train=_patterns(patterns))

    @classmethod
    def freezing(cls, *patterns: str) -> Partition:
        """Freeze the parameters matching any of `patterns`, train the rest."""
        return cls(freeze=_patterns(patterns))

    @classmethod
    def freezing_blocks(cls, n: int) -> Partition:
        """Freeze the first `n` numbered blocks (the first `.<index>.` in a name)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"freezing_blocks needs a non-negative int, got {n!r}")
        return cls(frozen_blocks=n)

    def __call__(self, name: str) -> bool:
        """Whether the parameter called `name` trains."""
        if self.train and not any(fnmatch.fnmatchcase(name, p) for p in self.train):
            return False
        if any(fnmatch.fnmatchcase(name, p) for p in self.freeze):
            return False
        block = _BLOCK.search(name)
        return not (block and int(block.group(1)) < self.frozen_blocks)


def _patterns(patterns: tuple[str, ...]) -> tuple[str, ...]:
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise ValueError(f"a partition needs non-empty name patterns, got {patterns!r}")
    return tuple(patterns)


def trainable_names(model: Any, impl: str, trainable: Any) -> list[str]:
    """The names of `model`'s parameters that `trainable` (a `Partition`) trains."""
    from zoo.libraries import interface

    api = interface(impl)
    static, params, _ = api.split(model)
    return [n for n in api.leaf_names(static, params) if trainable(n)]
