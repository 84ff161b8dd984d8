"""The benchmark's single conv-transpose layer as a PyTorch model (imported only for torch)."""

from __future__ import annotations

import torch

from zoo.bench.archs.convt import ConvTSpec


class TorchConvT(torch.nn.Module):
    """`torch.nn.ConvTranspose3d` with the spec's hyper-parameters, named `convt`."""

    def __init__(self, config: ConvTSpec) -> None:
        super().__init__()
        s = self.config = config
        self.convt = torch.nn.ConvTranspose3d(
            s.in_channels, s.out_channels, s.kernel_size, stride=s.stride, padding=s.padding,
            output_padding=s.output_padding, dilation=s.dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convt(x)
