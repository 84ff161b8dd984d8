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


class BasicBlock(nn.Module):
    """conv3x3 (strided) bn relu, conv3x3 bn, + shortcut, relu."""

    def __init__(self, config: ResNetConfig, spec: BlockSpec) -> None:
        super().__init__()
        p = spec.planes
        self.conv1 = _conv(spec.in_channels, p, 3, spec.stride, config.conv_padding(1))
        self.bn1 = _bn(config, p)
        self.conv2 = _conv(p, p, 3, 1, config.conv_padding(1))
        self.bn2 = _bn(config, p)
        self.downsample = _shortcut(config, spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    """conv1x1 bn relu, conv3x3 (strided, grouped) bn relu, conv1x1 (x4) bn, + shortcut,
    relu."""

    def __init__(self, config: ResNetConfig, spec: BlockSpec) -> None:
        super().__init__()
        w, out = spec.width, spec.planes * config.expansion
        self.conv1 = _conv(spec.in_channels, w, 1, 1, config.conv_padding(0))
        self.bn1 = _bn(config, w)
        self.conv2 = _conv(w, w, 3, spec.stride, config.conv_padding(1), config.groups)
        self.bn2 = _bn(config, w)
        self.conv3 = _conv(w, out, 1, 1, config.conv_padding(0))
        self.bn3 = _bn(config, out)
        self.downsample = _shortcut(config, spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (x if self.downsample is None else self.downsample(x)))


BLOCKS: dict[str, type[nn.Module]] = {"basic": BasicBlock, "bottleneck": Bottleneck}


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
                *(BLOCKS[config.block](config, spec) for spec in blocks)))
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
