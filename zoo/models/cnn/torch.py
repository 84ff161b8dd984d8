"""CNN in PyTorch: the reference implementation (batched `(N, C, H, W)`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.cnn.config import CNNConfig


class CNN(nn.Module):
    def __init__(self, config: CNNConfig) -> None:
        super().__init__()
        self.config = config
        c1, c2 = config.features
        c, h, w = config.flatten_shape
        bn = lambda n: nn.BatchNorm2d(n, eps=config.bn_eps, momentum=1.0 - config.bn_momentum)
        self.conv1 = nn.Conv2d(config.in_channels, c1, 3, padding=1)
        self.bn1 = bn(c1) if config.batch_norm else None
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.bn2 = bn(c2) if config.batch_norm else None
        self.fc1 = nn.Linear(c * h * w, config.hidden)
        self.dropout = nn.Dropout(config.dropout)
        self.fc2 = nn.Linear(config.hidden, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, bn in ((self.conv1, self.bn1), (self.conv2, self.bn2)):
            x = conv(x)
            if bn is not None:
                x = bn(x)
            x = F.avg_pool2d(F.relu(x), 2)
        x = self.fc1(x.flatten(1))
        x = F.relu(self.dropout(x))
        return self.fc2(x)
