"""CNN in PyTorch: the reference implementation (batched `(N, C, H, W)`)."""

from __future__ import annotations

import math
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.cnn.config import CNNConfig


class CNN(nn.Module):
    def __init__(self, config: CNNConfig) -> None:
        super().__init__()
        self.config = config
        c = (config.in_channels, *config.features)
        self.convs = nn.ModuleList(nn.Conv2d(i, o, 3, padding=1)
                                   for i, o in pairwise(c))
        self.bns = nn.ModuleList(
            nn.BatchNorm2d(o, eps=config.bn_eps, momentum=1.0 - config.bn_momentum)
            for o in (config.features if config.batch_norm else ()))
        self.fc1 = nn.Linear(math.prod(config.flatten_shape), config.hidden)
        self.dropout = nn.Dropout(config.dropout)
        self.fc2 = nn.Linear(config.hidden, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.config.check_input(x.shape)
        for i, conv in enumerate(self.convs):
            x = conv(x)
            if self.bns:
                x = self.bns[i](x)
            x = F.avg_pool2d(F.relu(x), 2)
        x = self.fc1(x.flatten(1))
        x = F.relu(self.dropout(x))
        return self.fc2(x)
