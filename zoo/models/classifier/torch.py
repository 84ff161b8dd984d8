"""timm's classifier API for PyTorch models (`zoo.models.classifier`): `reset_classifier`
changes the model in place, as timm's."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from zoo.models.intermediates import MAPS, check_format, permutation


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


class StagedClassifier(Classifier):
    """A Classifier of feature maps made by a stem and stages (timm's CNNs), whose
    `forward_intermediates` this writes: the model writes `forward_stem` (the stem's tap and
    the first stage's input), `forward_stage`, optionally `forward_end` (what follows the last
    stage), and its config `taps` (timm's tap positions) and `num_stages`."""

    def forward_intermediates(
            self, x: torch.Tensor, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW",
            intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's: `(forward_features(x), taps)` or, `intermediates_only`, the taps: the
        feature maps at `config.taps`' positions (0: the stem's, i: stage i - 1's output), in
        `output_fmt` ("NCHW" or "NHWC"). `indices`: the last n taps (int), those listed, or
        all (None); `stop_early` skips the stages after the last one taken (and then
        `forward_end`); `norm` changes nothing (no norm before the head, as timm's)."""
        del norm
        take, last = self.config.taps(indices, stop_early, intermediates_only)
        check_format(output_fmt, MAPS)
        self.config.check_input(x.shape)
        tap, x = self.forward_stem(x)
        taps = [tap] if 0 in take else []
        stages = last if stop_early else self.config.num_stages
        for i in range(stages):
            x = self.forward_stage(i, x)
            if i + 1 in take:
                taps.append(x)
        taps = [t.permute(permutation("NCHW", output_fmt)) for t in taps]
        if intermediates_only:
            return taps
        return (self.forward_end(x) if stages == self.config.num_stages else x), taps

    def forward_end(self, x: torch.Tensor) -> torch.Tensor:
        """The features from the last stage's output: that output (a model may add layers)."""
        return x
