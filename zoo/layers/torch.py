"""PyTorch layers of the zoo's reference models (imported with torch, by the `torch` models)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import canonical

__all__ = ["DropPath", "GlobalResponseNorm", "LayerNorm2d"]


class DropPath(nn.Module):
    """timm's `DropPath` (stochastic depth, `scale_by_keep=True`): in training, each sample of
    the batch (axis 0) is kept with probability `1 - rate` and scaled by `1 / (1 - rate)`; the
    identity in eval mode and at `rate == 0`. The mask is drawn as timm draws it (`bernoulli_`
    on the default generator, nothing drawn at `rate == 0`), so a seeded run equals timm's.

    `keep`: a `(N,)` mask to use instead of drawing one (None: draw). Tests give it the mask
    the JAX libraries draw from a key (`zoo.layers.drop_path.keep_mask`), which PyTorch's
    generator cannot reproduce."""

    def __init__(self, rate: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"drop path rate must be in [0, 1), found {rate}")
        self.rate = rate
        self.keep: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return x
        keep_prob = 1.0 - self.rate
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        if self.keep is None:
            mask = x.new_empty(shape).bernoulli_(keep_prob)
        else:
            if tuple(self.keep.shape) != (x.shape[0],):
                raise ValueError(f"DropPath.keep holds {self.keep.numel()} values (shape "
                                 f"{tuple(self.keep.shape)}) for a batch of {x.shape[0]}")
            mask = self.keep.to(x.dtype).reshape(shape).clone()
        return x * mask.div_(keep_prob)

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


class LayerNorm2d(nn.LayerNorm):
    """timm's `LayerNorm2d`: a LayerNorm over the channels of an `(N, C, H, W)` map (the
    `layer_norm` kind, as every `nn.LayerNorm`); eps 1e-6 by default, as timm's."""

    def __init__(self, num_channels: int, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(num_channels, eps=eps, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class GlobalResponseNorm(nn.Module):
    """timm's `GlobalResponseNorm` (ConvNeXt V2), the same computation: `weight`, `bias` of
    the channels (zeros at first); channels last `(N, H, W, C)` or first `(N, C, H, W)`."""

    def __init__(self, dim: int, eps: float = 1e-6, channels_last: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.spatial_dim, self.channel_dim, self.wb_shape = (
            ((1, 2), -1, (1, 1, 1, -1)) if channels_last else ((2, 3), 1, (1, -1, 1, 1)))
        self.weight = nn.Parameter(torch.zeros(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_g = x.norm(p=2, dim=self.spatial_dim, keepdim=True)
        x_n = x_g / (x_g.mean(dim=self.channel_dim, keepdim=True) + self.eps)
        return x + torch.addcmul(self.bias.view(self.wb_shape), self.weight.view(self.wb_shape),
                                 x * x_n)


canonical.register_class("global_response_norm", "torch", GlobalResponseNorm)
