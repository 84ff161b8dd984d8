"""EfficientNet in PyTorch: the reference implementation (batched `(N, C, H, W)`), module for
module timm's `EfficientNet` (so its state_dict keys are timm's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.efficientnet.config import EfficientNetConfig
from zoo.models.intermediates import MAPS, check_format, permutation, take_indices
from zoo.models.mbconv.torch import ACTIVATIONS, batch_norm, blocks, conv


class EfficientNet(nn.Module):
    def __init__(self, config: EfficientNetConfig) -> None:
        super().__init__()
        self.config = config
        self.conv_stem = conv(config, config.in_channels, config.stem_chs, 3, 2)
        self.bn1 = batch_norm(config, config.stem_chs)
        self.blocks = blocks(config)
        self.conv_head = conv(config, config.block_chs, config.head_chs, 1)
        self.bn2 = batch_norm(config, config.head_chs)
        self.classifier = nn.Linear(config.features, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The head conv's feature map `(N, C', H', W')` (after bn2 and the activation),
        before pooling (timm's)."""
        return self.forward_intermediates(x, indices=1)[0]

    def forward_intermediates(
            self, x: torch.Tensor, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW",
            intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's: the feature maps at `config.stage_ends` (0: after the stem, i: after stage
        i - 1: where the next stage strides, and the last), in `output_fmt` ("NCHW" or
        "NHWC"). `indices`: the last n taps (int), those listed, or all (None); `stop_early`
        skips the stages after the last one taken (and then the head conv, as timm's);
        `norm` changes nothing. Returns `(features, taps)`, or the taps."""
        del norm
        ends = self.config.stage_ends
        take, last = take_indices(len(ends), indices)
        take, last = [ends[i] for i in take], ends[last]
        check_format(output_fmt, MAPS)
        self.config.check_input(x.shape)
        act = ACTIVATIONS[self.config.act]
        x = act(self.bn1(self.conv_stem(x)))
        taps = [x] if 0 in take else []
        stages = len(self.blocks) if not stop_early else last
        for i in range(stages):
            x = self.blocks[i](x)
            if i + 1 in take:
                taps.append(x)
        taps = [t.permute(permutation("NCHW", output_fmt)) for t in taps]
        if intermediates_only:
            return taps
        if stages == len(self.blocks):
            x = act(self.bn2(self.conv_head(x)))
        return x, taps

    def reset_classifier(self, num_classes: int) -> None:
        """A new classifier for `num_classes`, initialised by PyTorch (in place, as timm's;
        the config follows)."""
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        self.classifier = nn.Linear(self.config.features, num_classes,
                                    dtype=self.classifier.weight.dtype,
                                    device=self.classifier.weight.device)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Logits of a feature map: global average pool, dropout, classifier (`pre_logits`:
        the pooled features)."""
        x = F.dropout(x.mean(dim=(2, 3)), self.config.drop_rate, self.training)
        return x if pre_logits else self.classifier(x)
