"""UNet3D in PyTorch: the reference implementation (batched `(N, C, D, H, W)`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.layers.conv_transpose_spec import ConvTransposeSpec
from zoo.models.unet3d.config import UNet3DConfig


def _norm(config: UNet3DConfig, channels: int) -> nn.Module:
    if config.norm == "batch":
        return nn.BatchNorm3d(channels, eps=config.norm_eps, momentum=1.0 - config.bn_momentum)
    return nn.GroupNorm(config.groups, channels, eps=config.norm_eps)


class ConvBlock(nn.Module):
    """Two conv3x3x3 (no bias) + norm + relu."""

    def __init__(self, config: UNet3DConfig, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(cin, cout, 3, padding=1, bias=False)
        self.norm1 = _norm(config, cout)
        self.conv2 = nn.Conv3d(cout, cout, 3, padding=1, bias=False)
        self.norm2 = _norm(config, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(x)))


def _up(spec: ConvTransposeSpec) -> nn.ConvTranspose3d:
    return nn.ConvTranspose3d(spec.in_channels, spec.out_channels, spec.kernel_size,
                              stride=spec.stride, padding=spec.padding,
                              output_padding=spec.output_padding, dilation=spec.dilation)


class UNet3D(nn.Module):
    def __init__(self, config: UNet3DConfig) -> None:
        super().__init__()
        self.config = config
        w = config.widths
        ins = (config.in_channels, *w[:-2])
        self.encoders = nn.ModuleList(ConvBlock(config, i, o)
                                      for i, o in zip(ins, w[:-1], strict=True))
        self.downs = nn.ModuleList(nn.Conv3d(c, c, 2, stride=2) for c in w[:-1]) if (
            config.down == "conv") else nn.ModuleList()
        self.bottleneck = ConvBlock(config, w[-2], w[-1])
        self.ups = nn.ModuleList(_up(spec) for spec in config.conv_transposes())
        self.decoders = nn.ModuleList(ConvBlock(config, 2 * c, c) for c in config.decoder_widths())
        self.head = nn.Conv3d(w[0], config.out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.config.check_input(x.shape)
        skips = []
        for i, encoder in enumerate(self.encoders):
            x = encoder(x)
            skips.append(x)
            x = self.downs[i](x) if len(self.downs) else F.max_pool3d(x, 2)
        x = self.bottleneck(x)
        for up, decoder, skip in zip(self.ups, self.decoders, reversed(skips), strict=True):
            x = decoder(torch.cat([skip, up(x)], dim=1))  # CONCAT_ORDER
        return self.head(x)
