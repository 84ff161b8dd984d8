"""timm's classifier API for Equinox models (`zoo.models.classifier`), per sample: a model with
state passes it to `forward_features` and gets `(features, state)` back."""

from __future__ import annotations

import copy
import dataclasses
import operator
from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.eqx import Linear
from zoo.models.intermediates import MAPS, check_format, permutation


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


class StagedClassifier(Classifier):
    """A Classifier of feature maps made by a stem and stages (timm's CNNs), whose
    `forward_intermediates` this writes: the model writes `forward_stem` (the stem's tap and
    the first stage's input), `forward_stage`, optionally `forward_end` (what follows the last
    stage), and its config `taps` (timm's tap positions) and `num_stages`. Each takes and
    gives back the state (None in a model without one)."""

    def forward_intermediates(
            self, x: Array, state: eqx.nn.State | None = None,
            indices: int | Sequence[int] | None = None, norm: bool = False,
            stop_early: bool = False, output_fmt: str = "NCHW",
            intermediates_only: bool = False, *, key: PRNGKeyArray | None = None) -> Any:
        """timm's, per image: `(forward_features(x), taps)` or, `intermediates_only`, the
        taps (with the model's state: `(that, state)`): the feature maps at `config.taps`'
        positions (0: the stem's, i: stage i - 1's output), each `(C, H, W)` for `output_fmt`
        "NCHW" (the default) or `(H, W, C)` for "NHWC". `indices`: the last n taps (int),
        those listed, or all (None); `stop_early` skips the stages after the last one taken
        (and then `forward_end`); `norm` changes nothing (no norm before the head, as
        timm's); `key`: the drop paths' (training)."""
        del norm
        take, last = self.config.taps(indices, stop_early, intermediates_only)
        check_format(output_fmt, MAPS)
        self.config.check_input(x.shape, batched=False)
        tap, x, state = self.forward_stem(x, state)
        taps = [tap] if 0 in take else []
        stages = last if stop_early else self.config.num_stages
        for i in range(stages):
            x, state = self.forward_stage(i, x, state, key=key)
            if i + 1 in take:
                taps.append(x)
        perm = permutation("NCHW", output_fmt, batched=False)
        taps = [t.transpose(perm) for t in taps]
        if not intermediates_only and stages == self.config.num_stages:
            x, state = self.forward_end(x, state)
        out = taps if intermediates_only else (x, taps)
        return out if state is None else (out, state)

    def forward_end(self, x: Array, state: eqx.nn.State | None) -> tuple[Array, Any]:
        """The features from the last stage's output: that output (a model may add layers)."""
        return x, state
