"""timm's classifier API for Flax NNX models (`zoo.models.classifier`): `reset_classifier`
changes the model in place, as timm's."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
from flax import nnx

from zoo.models.intermediates import MAPS, check_format, permutation


class Classifier(nnx.Module):
    """Subclassed by a model whose classifier is the Linear at `CLASSIFIER`; the model writes
    `forward_intermediates` (timm's: `(features, taps)`) and `pre_logits` (the classifier's
    input from the features)."""

    CLASSIFIER: ClassVar[str] = "classifier"

    def forward_features(self, x: jax.Array, **kwargs: Any) -> jax.Array:
        """The features before the head (timm's): `forward_intermediates`' features."""
        return self.forward_intermediates(x, indices=1, **kwargs)[0]

    def forward_head(self, x: jax.Array, pre_logits: bool = False, **kwargs: Any) -> jax.Array:
        """Logits of `forward_features`' output (`pre_logits`: the classifier's input)."""
        x = self.pre_logits(x, **kwargs)
        return x if pre_logits else operator.attrgetter(self.CLASSIFIER)(self)(x)

    def reset_classifier(self, num_classes: int, *, rngs: nnx.Rngs) -> None:
        """A new classifier for `num_classes`, initialised by NNX (in place, as timm's; the
        config follows)."""
        owner_path, _, name = self.CLASSIFIER.rpartition(".")
        owner = operator.attrgetter(owner_path)(self) if owner_path else self
        dtype = getattr(owner, name).kernel.dtype
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        setattr(owner, name, nnx.Linear(self.config.features, num_classes, param_dtype=dtype,
                                        rngs=rngs))


class StagedClassifier(Classifier):
    """A Classifier of feature maps made by a stem and stages (timm's CNNs), whose
    `forward_intermediates` this writes: the model writes `forward_stem` (the stem's tap and
    the first stage's input), `forward_stage`, optionally `forward_end` (what follows the last
    stage) and `stage_arguments`, and its config `taps` (timm's tap positions) and
    `num_stages`. The call's keywords (`rngs=`) go to `forward_stem` and `forward_end`,
    `stage_arguments`' to `forward_stage`."""

    def forward_intermediates(
            self, x: jax.Array, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NHWC",
            intermediates_only: bool = False, **kwargs: Any,
    ) -> list[jax.Array] | tuple[jax.Array, list[jax.Array]]:
        """timm's: `(forward_features(x), taps)` or, `intermediates_only`, the taps: the
        feature maps at `config.taps`' positions (0: the stem's, i: stage i - 1's output),
        channels-last by default ("NHWC"; "NCHW" is timm's layout). `indices`: the last n taps
        (int), those listed, or all (None); `stop_early` skips the stages after the last one
        taken (and then `forward_end`); `norm` changes nothing (no norm before the head, as
        timm's)."""
        del norm
        take, last = self.config.taps(indices, stop_early, intermediates_only)
        check_format(output_fmt, MAPS)
        self.config.check_input(x.shape, channels_last=True)
        arguments = self.stage_arguments(x, **kwargs)
        tap, x = self.forward_stem(x, **kwargs)
        taps = [tap] if 0 in take else []
        stages = last if stop_early else self.config.num_stages
        for i in range(stages):
            x = self.forward_stage(i, x, **arguments)
            if i + 1 in take:
                taps.append(x)
        taps = [t.transpose(permutation("NHWC", output_fmt)) for t in taps]
        if intermediates_only:
            return taps
        return (self.forward_end(x, **kwargs) if stages == self.config.num_stages else x), taps

    def stage_arguments(self, x: jax.Array, **kwargs: Any) -> dict[str, Any]:
        """`forward_stage`'s keywords in a call on `x` with `kwargs`: those (a model draws
        its per-call randomness here)."""
        return kwargs

    def forward_end(self, x: jax.Array, **kwargs: Any) -> jax.Array:
        """The features from the last stage's output: that output (a model may add layers)."""
        return x
