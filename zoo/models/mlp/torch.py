"""MLP in PyTorch: the reference implementation (batched `(N, in_features)`)."""

from __future__ import annotations

from itertools import pairwise

import torch
from torch import nn

from zoo.models.mlp.config import MLPConfig


class MLP(nn.Module):
    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        w = config.widths
        self.config = config
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in pairwise(w))
        self.act = nn.ReLU() if config.activation == "relu" else nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.config.check_input(x.shape)
        for layer in self.layers[:-1]:
            x = self.act(layer(x))
        return self.layers[-1](x)
