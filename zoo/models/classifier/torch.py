"""timm's classifier API for PyTorch models (`zoo.models.classifier`): `reset_classifier`
changes the model in place, as timm's."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import nn


class Classifier(nn.Module):
    """Subclassed by a model whose classifier is the Linear at `CLASSIFIER`; the model writes
    `forward_intermediates` (timm's: `(features, taps)`) and `pre_logits` (the classifier's
    input from the features)."""

    CLASSIFIER: ClassVar[str] = "classifier"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The features before the head (timm's): `forward_intermediates`' features."""
        return self.forward_intermediates(x, indices=1)[0]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Logits of `forward_features`' output (`pre_logits`: the classifier's input)."""
        x = self.pre_logits(x)
        return x if pre_logits else self.get_submodule(self.CLASSIFIER)(x)

    def reset_classifier(self, num_classes: int) -> None:
        """A new classifier for `num_classes`, initialised by PyTorch (in place, as timm's; the
        config follows)."""
        old = self.get_submodule(self.CLASSIFIER)
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        owner_path, _, name = self.CLASSIFIER.rpartition(".")
        setattr(self.get_submodule(owner_path), name,
                nn.Linear(self.config.features, num_classes, dtype=old.weight.dtype,
                          device=old.weight.device))
