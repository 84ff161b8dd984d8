"""Covers: the suite's cost grows with the layer kinds and cases, not with their products.

`covering_archs`: cheap architectures whose tiny configs together hold every layer kind, loss
and input dtype of the registry: a greedy cover by new features per layer of the tiny config
(its layer count stands for its compile time), in registry order on ties, then pruned of any
architecture the others make redundant.

Whole multi-device programs (tests/sharding_worker.py: a training step on 8 devices under
each strategy, per library) run these rather than every architecture: sharding is declared
per layer kind (its logical axes), per loss and per input, so an architecture adds nothing
there that its kinds do not; the single-device tests still run every architecture.

`cover`: a cross product (every case x every library pair x every mode) as pytest params, each
case run with a rotating share of the combos and the rest marked `exhaustive` (`--exhaustive`
runs them): every case and every combo is reached, the product only on demand.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import pytest

import zoo
from zoo.registry import schema


def features(arch: str) -> frozenset[str]:
    """The layer kinds, loss and input dtype of `arch`'s tiny config."""
    cfg = zoo.tiny_config(arch)
    layers, _ = schema(cfg)
    return frozenset({f"kind:{layer.kind}" for layer in layers}
                     | {f"loss:{cfg.LOSS}", f"input:{cfg.INPUT_DTYPE}"})


def layers(arch: str) -> int:
    """How many layers `arch`'s tiny config has: the cover's measure of its cost."""
    return len(schema(zoo.tiny_config(arch))[0])


@functools.cache
def covering_archs(archs: tuple[str, ...]) -> tuple[str, ...]:
    """The architectures of `archs` (in its order) that together hold every feature of all,
    chosen by new features per layer, none of them redundant."""
    have = {a: features(a) for a in archs}
    left = set().union(*have.values())
    chosen: list[str] = []
    while left:
        best = max(archs, key=lambda a: (len(have[a] & left) / layers(a), -archs.index(a)))
        chosen.append(best)
        left -= have[best]
    for arch in list(chosen):  # the first picks may be covered by later ones
        others = set().union(*(have[a] for a in chosen if a != arch))
        if have[arch] <= others:
            chosen.remove(arch)
    return tuple(a for a in archs if a in chosen)


def rotation(n_cases: int, n_combos: int, per_case: int = 1) -> list[frozenset[int]]:
    """For each of `n_cases` cases, the `per_case` combos (indices into `n_combos`) it runs:
    case i takes combos i*per_case, ..., i*per_case + per_case - 1 (mod n_combos). Every case
    runs, and the combos are taken in turn, so each is reached once there are enough cases."""
    per_case = min(per_case, n_combos)
    return [frozenset((i * per_case + j) % n_combos for j in range(per_case))
            for i in range(n_cases)]


Combo = Any  # a pytest.param, or a tuple of values


def _param(combo: Combo) -> Any:
    """`combo` as a pytest.param with an id (its values joined, where it has none)."""
    if not hasattr(combo, "values"):
        combo = pytest.param(*(combo if isinstance(combo, tuple) else (combo,)))
    return pytest.param(*combo.values, marks=combo.marks,
                        id=combo.id or "-".join(map(str, combo.values)))


def latin(xs: Sequence[Combo], ys: Sequence[Combo]) -> list[Any]:
    """The product xs x ys ordered in windows of len(xs): window w pairs xs[j] with
    ys[(j + w) % len(ys)], so a case given one window (`cover(..., per_case=len(xs))`) runs
    every x once, and the y each x meets turns from case to case."""
    xs, ys = [_param(x) for x in xs], [_param(y) for y in ys]
    return [pytest.param(*x.values, *y.values, id=f"{x.id}-{y.id}", marks=(*x.marks, *y.marks))
            for w in range(len(ys)) for j, x in enumerate(xs)
            for y in (ys[(j + w) % len(ys)],)]


def cover(cases: Sequence[Any], combos: Sequence[Combo], *, per_case: int = 1,
          ids: Sequence[str] | None = None) -> list[Any]:
    """The cross product `cases` x `combos` as pytest params `(*case, *combo)`; those outside
    the rotation (`rotation`) are marked `exhaustive`, which the suite runs with `--exhaustive`
    only. A case is a value, a tuple of values (named by `ids`) or a pytest.param (its marks
    kept)."""
    cases = ([_param(c) for c in cases] if ids is None else
             [pytest.param(*(c if isinstance(c, tuple) else (c,)), id=i)
              for c, i in zip(cases, ids, strict=True)])
    combos = [_param(c) for c in combos]
    chosen = rotation(len(cases), len(combos), per_case)
    return [pytest.param(*case.values, *combo.values, id=f"{case.id}-{combo.id}",
                         marks=(*case.marks, *combo.marks,
                                *(() if j in chosen[i] else (pytest.mark.exhaustive,))))
            for i, case in enumerate(cases) for j, combo in enumerate(combos)]


def options(config: zoo.Config) -> tuple[Any, ...]:
    """`config`'s architecture and its option fields (text, on/off, unset), not its sizes."""
    return (config.arch, *((f.name, v) for f in dataclasses.fields(config)
                           if isinstance(v := getattr(config, f.name), bool | str | None)))


def by_options(names: Sequence[str]) -> list[Any]:
    """Named models as pytest params: the first of each `options` signature runs, a name that
    differs from an earlier one only in sizes (widths, depths, heads, image size) is marked
    `exhaustive`."""
    seen: set[tuple[Any, ...]] = set()
    params = []
    for name in names:
        signature = options(zoo.make_config(name))
        params.append(pytest.param(name, marks=() if signature not in seen
                                   else (pytest.mark.exhaustive,)))
        seen.add(signature)
    return params

