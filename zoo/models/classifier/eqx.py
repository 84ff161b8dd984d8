"""timm's classifier API for Equinox models (`zoo.models.classifier`), per sample: a model with
state passes it to `forward_features` and gets `(features, state)` back."""

from __future__ import annotations

import copy
import dataclasses
import operator
from typing import Any, ClassVar

import equinox as eqx
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.eqx import Linear


class Classifier(eqx.Module):
    """Subclassed by a model whose classifier is the Linear at `CLASSIFIER`; the model writes
    `forward_intermediates` (timm's: `(features, taps)`, or `((features, taps), state)` with
    state) and `pre_logits` (the classifier's input from the features). A `key` (training)
    passes through to them when given."""

    CLASSIFIER: ClassVar[str] = "classifier"

    def forward_features(self, x: Array, state: eqx.nn.State | None = None, *,
                         key: PRNGKeyArray | None = None) -> Any:
        """The features before the head (timm's): `forward_intermediates`' features, and the
        state when the model has one."""
        args = () if state is None else (state,)
        out = self.forward_intermediates(x, *args, indices=1, **_given(key))
        if state is None:
            return out[0]
        (x, _), state = out
        return x, state

    def forward_head(self, x: Array, pre_logits: bool = False, *,
                     key: PRNGKeyArray | None = None) -> Array:
        """Logits of `forward_features`' output (`pre_logits`: the classifier's input)."""
        x = self.pre_logits(x, **_given(key))
        return x if pre_logits else operator.attrgetter(self.CLASSIFIER)(self)(x)

    def reset_classifier(self, num_classes: int, *, key: PRNGKeyArray) -> Any:
        """A new model whose classifier is a fresh Equinox Linear for `num_classes` (and whose
        config says so); this one is not changed. The config is a static field, which
        `eqx.tree_at` cannot replace."""
        where = operator.attrgetter(self.CLASSIFIER)
        fc = Linear(self.config.features, num_classes, key=key, dtype=where(self).weight.dtype)
        new = copy.copy(eqx.tree_at(where, self, fc))
        object.__setattr__(new, "config", dataclasses.replace(self.config,
                                                              num_classes=num_classes))
        return new


def _given(key: PRNGKeyArray | None) -> dict[str, PRNGKeyArray]:
    """`key=` for a model's method, only when there is one (models without randomness take
    none)."""
    return {} if key is None else {"key": key}
