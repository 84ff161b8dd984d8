"""Decoder3D in PyTorch: the reference implementation (batched `(N, C, D, H, W)`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.layers.conv_transpose_spec import ConvTransposeSpec
from zoo.models.decoder3d.config import Decoder3DConfig


def _layer(spec: ConvTransposeSpec) -> nn.ConvTranspose3d:
    return nn.ConvTranspose3d(
        spec.in_channels, spec.out_channels, spec.kernel_size, stride=spec.stride,
        padding=spec.padding, output_padding=spec.output_padding, dilation=spec.dilation,
    )


class Decoder3D(nn.Module):
    def __init__(self, config: Decoder3DConfig) -> None:
        super().__init__()
        self.config = config
        *ups, head = (_layer(s) for s in config.conv_transposes())
        self.ups = nn.ModuleList(ups)  # stages first: the state_dict lists ups.i, then head
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.config.check_input(x.shape)
        for up in self.ups:
            x = F.relu(up(x))
        return self.head(x)
