"""ConvNeXt in PyTorch: the reference implementation (batched `(N, C, H, W)`), module for module
timm's `ConvNeXt` (so its state_dict keys are timm's: `stem.0`, `stages.i.blocks.j.conv_dw`,
`.gamma`, `head.fc`, ...)."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.layers.torch import DropPath, GlobalResponseNorm, LayerNorm2d
from zoo.models.classifier.torch import StagedClassifier
from zoo.models.convnext.config import ConvNeXtConfig


class Mlp(nn.Module):
    """timm's `Mlp` / `GlobalResponseNormMlp`: fc1, GELU, (GRN,) fc2; Linear layers on a
    channels-last map, or 1x1 convolutions on a channels-first one (`conv`)."""

    def __init__(self, dim: int, hidden: int, grn: bool, conv: bool) -> None:
        super().__init__()
        linear = (lambda i, o: nn.Conv2d(i, o, 1)) if conv else nn.Linear
        self.fc1 = linear(dim, hidden)
        self.grn = GlobalResponseNorm(hidden, channels_last=not conv) if grn else None
        self.fc2 = linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.fc1(x))
        if self.grn is not None:
            x = self.grn(x)
        return self.fc2(x)


class Block(nn.Module):
    """conv_dw, norm, MLP, layer scale, drop path, + the input (timm's `ConvNeXtBlock`)."""

    def __init__(self, config: ConvNeXtConfig, dim: int, drop_path: float) -> None:
        super().__init__()
        k = config.kernel_size
        self.conv_mlp = config.conv_mlp
        self.gamma = (nn.Parameter(config.ls_init_value * torch.ones(dim))
                      if config.layer_scale else None)
        self.conv_dw = nn.Conv2d(dim, dim, k, padding=k // 2, groups=dim)
        self.norm = (LayerNorm2d(dim, eps=config.norm_eps) if config.conv_mlp
                     else nn.LayerNorm(dim, eps=config.norm_eps))
        self.mlp = Mlp(dim, config.mlp_hidden(dim), config.use_grn, config.conv_mlp)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv_dw(x)
        if self.conv_mlp:
            y = self.mlp(self.norm(y))
        else:
            y = self.mlp(self.norm(y.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        if self.gamma is not None:
            y = y.mul(self.gamma.reshape(1, -1, 1, 1))
        return self.drop_path(y) + x


class Stage(nn.Module):
    """`downsample` (LayerNorm2d, 2x2 conv of stride 2; none in the first stage), `blocks`."""

    def __init__(self, config: ConvNeXtConfig, i: int) -> None:
        super().__init__()
        dim = config.dims[i]
        self.downsample = (nn.Sequential(LayerNorm2d(config.dims[i - 1], eps=config.norm_eps),
                                         nn.Conv2d(config.dims[i - 1], dim, 2, stride=2))
                           if i > 0 else None)
        self.blocks = nn.Sequential(*(Block(config, dim, rate)
                                      for rate in config.drop_path_rates()[i]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.downsample is not None:
            x = self.downsample(x)
        return self.blocks(x)


class Head(nn.Module):
    """timm's `NormMlpClassifierHead` as ConvNeXt builds it: average pool, `norm`, `fc`."""

    def __init__(self, config: ConvNeXtConfig) -> None:
        super().__init__()
        self.norm = LayerNorm2d(config.features, eps=config.norm_eps)
        self.fc = nn.Linear(config.features, config.num_classes)

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.norm(x.mean((2, 3), keepdim=True)).flatten(1)
        return x if pre_logits else self.fc(x)


class ConvNeXt(StagedClassifier):
    CLASSIFIER: ClassVar[str] = "head.fc"

    def __init__(self, config: ConvNeXtConfig) -> None:
        super().__init__()
        self.config = config
        p = config.patch_size
        self.stem = nn.Sequential(nn.Conv2d(config.in_channels, config.dims[0], p, stride=p),
                                  LayerNorm2d(config.dims[0], eps=config.norm_eps))
        self.stages = nn.Sequential(*(Stage(config, i) for i in range(len(config.depths))))
        self.head = Head(config)

    def forward_stem(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.stem(x)
        return x, x

    def forward_stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.stages[i](x)

    def pre_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The global average pool of a feature map, `head.norm`ed (the input of `head.fc`)."""
        return self.head(x, pre_logits=True)
