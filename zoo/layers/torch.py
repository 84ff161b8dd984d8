"""PyTorch layers of the zoo's reference models (imported with torch, by the `torch` models)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DropPath"]


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
