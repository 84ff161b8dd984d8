"""timm's EfficientNet blocks and network in PyTorch, module for module (so their state_dict
keys are timm's): `MBConvNet` (timm's `EfficientNet` and `MobileNetV3`), `DepthwiseSeparable`
(conv_dw bn1 [se] conv_pw bn2), `InvertedResidual` (conv_pw bn1 conv_dw bn2 [se] conv_pwl
bn3), `ConvBnAct` (conv bn1), `SqueezeExcite` (conv_reduce conv_expand), built from
`spec.BlockSpec`s."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from zoo.layers.torch import DropPath
from zoo.models.classifier.torch import StagedClassifier
from zoo.models.mbconv.config import MBConvNetConfig
from zoo.models.mbconv.spec import BlockSpec, ConvLayer
from zoo.models.resnet.torch import Conv2dSame

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu, "relu6": F.relu6, "silu": F.silu, "hard_swish": F.hardswish,
    "sigmoid": torch.sigmoid, "hard_sigmoid": F.hardsigmoid}


def conv(config: MBConvNetConfig, cin: int, cout: int, kernel: int, stride: int = 1,
         groups: int = 1, bias: bool = False) -> nn.Conv2d:
    """timm's `create_conv2d`: symmetric padding, or TensorFlow's SAME at run time."""
    padding = config.conv_padding(kernel, stride)
    if padding == "SAME":
        return Conv2dSame(cin, cout, kernel, stride=stride, groups=groups, bias=bias)
    return nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, groups=groups, bias=bias)


def batch_norm(config: MBConvNetConfig, channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=config.bn_eps, momentum=1.0 - config.bn_momentum)


class SqueezeExcite(nn.Module):
    """x * gate(conv_expand(act(conv_reduce(mean(x)))))."""

    def __init__(self, config: MBConvNetConfig, channels: int, reduced: int, act: str) -> None:
        super().__init__()
        self.conv_reduce = nn.Conv2d(channels, reduced, 1, bias=True)
        self.conv_expand = nn.Conv2d(reduced, channels, 1, bias=True)
        self.act = ACTIVATIONS[config.SE.act or act]
        self.gate = ACTIVATIONS[config.SE.gate]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.conv_expand(self.act(self.conv_reduce(x.mean((2, 3), keepdim=True))))
        return x * self.gate(s)


def _se(config: MBConvNetConfig, spec: BlockSpec) -> SqueezeExcite | None:
    return SqueezeExcite(config, spec.mid_chs, spec.se_chs, spec.act) if spec.se_chs else None


class Block(nn.Module):
    """One of timm's blocks as its spec lays it out (`BlockSpec.layers`):
    `DepthwiseSeparable` (conv_dw bn1 act [se] conv_pw bn2 [act]), `InvertedResidual`
    (conv_pw bn1 act, conv_dw bn2 act, [se], conv_pwl bn3) or `ConvBnAct` (conv bn1 act),
    then drop path and the skip (`spec.skip`)."""

    def __init__(self, config: MBConvNetConfig, spec: BlockSpec) -> None:
        super().__init__()
        self.spec = spec
        before, after = spec.layers()
        self._add(config, before)
        self.se = _se(config, spec)
        self._add(config, after)
        self.drop_path = DropPath(spec.drop_path)

    def _add(self, config: MBConvNetConfig, layers: tuple[ConvLayer, ...]) -> None:
        """Each layer's conv and BatchNorm, by their names."""
        for layer in layers:
            setattr(self, layer.conv, conv(config, layer.in_chs, layer.out_chs, layer.kernel,
                                           layer.stride, layer.groups))
            setattr(self, layer.bn, batch_norm(config, layer.out_chs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        before, after = self.spec.layers()
        y = self._layers(before, x)
        if self.se is not None:
            y = self.se(y)
        y = self._layers(after, y)
        return self.drop_path(y) + x if self.spec.skip else y

    def _layers(self, layers: tuple[ConvLayer, ...], y: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            y = getattr(self, layer.bn)(getattr(self, layer.conv)(y))
            y = ACTIVATIONS[self.spec.act](y) if layer.act else y
        return y


def blocks(config: MBConvNetConfig) -> nn.Sequential:
    """`blocks.i.j`: one Sequential per stage."""
    return nn.Sequential(*(nn.Sequential(*(Block(config, s) for s in stage))
                           for stage in config.stages()))


class MBConvNet(StagedClassifier):
    """timm's `EfficientNet` / `MobileNetV3` (the reference implementation, batched
    `(N, C, H, W)`), as its config says: conv_stem bn1 act, `blocks.i.j`, then EfficientNet's
    head (conv_head bn2 act on the feature map, pool, dropout, classifier) or, with
    `config.EFFICIENT_HEAD`, MobileNetV3's (pool, conv_head with bias, act, dropout,
    classifier).
    `forward_features` is the map before pooling: the head conv's, or the last stage's before
    an efficient head."""

    def __init__(self, config: MBConvNetConfig) -> None:
        super().__init__()
        efficient = config.EFFICIENT_HEAD
        self.config = config
        self.conv_stem = conv(config, config.in_channels, config.stem_chs, 3, 2)
        self.bn1 = batch_norm(config, config.stem_chs)
        self.blocks = blocks(config)
        self.conv_head = conv(config, config.block_chs, config.head_chs, 1, bias=efficient)
        self.bn2 = None if efficient else batch_norm(config, config.head_chs)
        self.classifier = nn.Linear(config.features, config.num_classes)

    def forward_stem(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = ACTIVATIONS[self.config.act](self.bn1(self.conv_stem(x)))
        return x, x

    def forward_stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[i](x)

    def forward_end(self, x: torch.Tensor) -> torch.Tensor:
        """EfficientNet's head conv on the last stage's output (an efficient head has its
        own after the pool)."""
        if self.config.EFFICIENT_HEAD:
            return x
        return ACTIVATIONS[self.config.act](self.bn2(self.conv_head(x)))

    def pre_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The classifier's input from a feature map: global average pool (then an efficient
        head's conv_head and act), dropout (in training)."""
        if self.config.EFFICIENT_HEAD:
            x = self.conv_head(x.mean(dim=(2, 3), keepdim=True))
            x = ACTIVATIONS[self.config.act](x).flatten(1)
        else:
            x = x.mean(dim=(2, 3))
        return F.dropout(x, self.config.drop_rate, self.training)
