"""ResNet in PyTorch: the reference implementation (batched `(N, C, H, W)`), module for module
torchvision's `ResNet` (so its state_dict keys are torchvision's)."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.classifier.torch import StagedClassifier
from zoo.models.resnet.config import POOL, BlockSpec, ResNetConfig, same_pads


def _pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    """`x` padded as SAME for its own height and width (timm's `pad_same`)."""
    (top, bottom), (left, right) = (same_pads(n, kernel, stride) for n in x.shape[-2:])
    return F.pad(x, (left, right, top, bottom), value=value)


class Conv2dSame(nn.Conv2d):
    """A Conv2d padded as Flax's SAME at run time (timm's `Conv2dSame`); same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(_pad_same(x, self.kernel_size[0], self.stride[0]))


class MaxPool2dSame(nn.MaxPool2d):
    """A MaxPool2d padded with -inf as Flax's SAME at run time (timm's `MaxPool2dSame`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _pad_same(x, self.kernel_size, self.stride, float("-inf"))
        return F.max_pool2d(x, self.kernel_size, self.stride)


def _conv(cin: int, cout: int, k: int, stride: int, padding: int | str,
          groups: int = 1) -> nn.Conv2d:
    if padding == "SAME":
        return Conv2dSame(cin, cout, k, stride=stride, groups=groups, bias=False)
    return nn.Conv2d(cin, cout, k, stride=stride, padding=padding, groups=groups, bias=False)


def _maxpool(config: ResNetConfig) -> nn.Module:
    if not config.stem_pool:
        return nn.Identity()
    k, s, p = POOL
    return MaxPool2dSame(k, s) if config.padding == "same" else nn.MaxPool2d(k, s, p)


def _bn(config: ResNetConfig, channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=config.bn_eps, momentum=1.0 - config.bn_momentum)


def _shortcut(config: ResNetConfig, spec: BlockSpec) -> nn.Sequential | None:
    out = spec.planes * config.expansion
    return nn.Sequential(_conv(spec.in_channels, out, 1, spec.stride, config.conv_padding(0)),
                         _bn(config, out)) if spec.downsample else None


class Block(nn.Module):
    """torchvision's BasicBlock or Bottleneck: `conv1 bn1 relu, ...` as `config.convs` lays
    them out (the last without relu), + shortcut, relu."""

    def __init__(self, config: ResNetConfig, spec: BlockSpec) -> None:
        super().__init__()
        convs = config.convs(spec)
        for i, (cin, cout, k, stride, groups) in enumerate(convs, 1):
            setattr(self, f"conv{i}", _conv(cin, cout, k, stride, config.conv_padding(k // 2),
                                            groups))
            setattr(self, f"bn{i}", _bn(config, cout))
        self.downsample = _shortcut(config, spec)
        self.depth = len(convs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for i in range(1, self.depth + 1):
            y = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(y))
            y = torch.relu(y) if i < self.depth else y
        return torch.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet(StagedClassifier):
    CLASSIFIER: ClassVar[str] = "fc"

    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        self.config = config
        self.conv1 = _conv(config.in_channels, config.stem_width, *config.stem_conv)
        self.bn1 = _bn(config, config.stem_width)
        self.maxpool = _maxpool(config)
        for i, blocks in enumerate(config.stages()):
            setattr(self, f"layer{i + 1}", nn.Sequential(
                *(Block(config, spec) for spec in blocks)))
        self.fc = nn.Linear(config.features, config.num_classes)

    def forward_stem(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tap 0 (after the stem's ReLU) and the first stage's input (max-pooled)."""
        x = torch.relu(self.bn1(self.conv1(x)))
        return x, self.maxpool(x)

    def forward_stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, f"layer{i + 1}")(x)

    def pre_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The global average pool of a feature map (the input of `fc`)."""
        return x.mean(dim=(2, 3))
