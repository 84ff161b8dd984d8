"""The fewest architectures whose tiny configs together hold every layer kind, loss and input
dtype of the registry (a greedy cover, in registry order on ties).

Whole multi-device programs (tests/sharding_worker.py: a training step on 8 devices under
each strategy, per library) run these rather than every architecture: sharding is declared
per layer kind (its logical axes), per loss and per input, so an architecture adds nothing
there that its kinds do not; the single-device tests still run every architecture.
"""

from __future__ import annotations

import functools

import zoo
from zoo.registry import schema


def features(arch: str) -> frozenset[str]:
    """The layer kinds, loss and input dtype of `arch`'s tiny config."""
    cfg = zoo.tiny_config(arch)
    layers, _ = schema(cfg)
    return frozenset({f"kind:{layer.kind}" for layer in layers}
                     | {f"loss:{cfg.LOSS}", f"input:{cfg.INPUT_DTYPE}"})


@functools.cache
def covering_archs(archs: tuple[str, ...]) -> tuple[str, ...]:
    """The architectures of `archs` (in its order) that together hold every feature of all."""
    have = {a: features(a) for a in archs}
    left = set().union(*have.values())
    chosen: list[str] = []
    while left:
        best = max(archs, key=lambda a: (len(have[a] & left), -archs.index(a)))
        chosen.append(best)
        left -= have[best]
    return tuple(a for a in archs if a in chosen)
