"""Tied parameters: one array used in two places (a language model's output head and its token
embedding), held once in the canonical state.

The canonical form is decided here, once: a tied pair is **one key**, its `source` (the
embedding, `transformer.wte.weight`), and the architecture declares the tie (`Config.ties`:
`Tie("lm_head.weight", "transformer.wte.weight")`). The zoo's models in every library hold
the array once and compute the head from it (Flax `Embed.attend`, Equinox and PyTorch
`x @ weight.T`), so no layer and no walker sees the `alias`; safetensors files and checkpoints
store the shared tensor once, as `transformers`' `save_pretrained` does.

A state from elsewhere may list the alias beside its source (`transformers`' `state_dict()`
does, for a tied model): `untie` accepts it when the two arrays are equal, and drops it,
refuses it by name when they differ (a checkpoint of an untied model read as a tied one);
`tie` writes the alias back for a reader that wants `transformers`' `state_dict()` keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from canonical.errors import ConversionError


@dataclass(frozen=True)
class Tie:
    """`alias` is the same array as `source`; the canonical state holds `source` only."""

    alias: str
    source: str


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))


def untie(state: Mapping[str, Any], ties: Iterable[Tie]) -> dict[str, Any]:
    """`state` without the aliases of `ties` (a new dict; nothing copied). An alias present
    beside its source must hold the same array (ConversionError naming both keys otherwise);
    an alias present without its source stands for it (renamed to the source)."""
    out = dict(state)
    for tie in ties:
        if tie.alias not in out:
            continue
        value = out.pop(tie.alias)
        if tie.source not in out:
            out[tie.source] = value
            continue
        if not _same(value, out[tie.source]):
            raise ConversionError(
                f"{tie.alias!r} differs from {tie.source!r}, which the architecture ties it to "
                f"(one array): the checkpoint is of an untied model (set tie_word_embeddings "
                f"false)")
    return {k: out[k] for k in _order(state, out, ties)}


def _order(before: Mapping[str, Any], after: Mapping[str, Any], ties: Iterable[Tie]
           ) -> list[str]:
    """`after`'s keys in `before`'s order, a source renamed from its alias in the alias's
    place."""
    renamed = {t.alias: t.source for t in ties}
    keys = [renamed.get(k, k) for k in before]
    return [k for k in dict.fromkeys(keys) if k in after]


def tie(state: Mapping[str, Any], ties: Iterable[Tie]) -> dict[str, Any]:
    """`state` with each alias added after the last key, the same array as its source (the
    keys of `transformers`' `state_dict()` for a tied model)."""
    out = dict(state)
    for t in ties:
        if t.source in out:
            out[t.alias] = out[t.source]
    return out
