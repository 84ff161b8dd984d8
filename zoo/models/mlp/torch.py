"""MLP in PyTorch: the reference implementation (batched `(N, in_features)`)."""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.mlp.config import MLPConfig


class MLP(nn.Module):
    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        h1, h2 = config.hidden
        self.config = config
        self.fc1 = nn.Linear(config.in_features, h1)
        self.fc2 = nn.Linear(h1, h2)
        self.fc3 = nn.Linear(h2, config.out_features)
        self.act = nn.ReLU() if config.activation == "relu" else nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.fc3(x)
