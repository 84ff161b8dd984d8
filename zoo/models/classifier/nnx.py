"""timm's classifier API for Flax NNX models (`zoo.models.classifier`): `reset_classifier`
changes the model in place, as timm's."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, ClassVar

import jax
from flax import nnx


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
