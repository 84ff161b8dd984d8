"""Decoder3D in Flax Linen: batched `(N, D, H, W, C)` latent."""

from __future__ import annotations

import flax.linen as nn
import jax

from zoo.layers.conv_transpose_spec import ConvTransposeSpec
from zoo.layers.linen import ConvTranspose
from zoo.models.common import dtype_of
from zoo.models.decoder3d.config import Decoder3DConfig


def _layer(spec: ConvTransposeSpec, method: str, dtype) -> ConvTranspose:
    k, s, _, _, d = spec.per_dim
    return ConvTranspose(spec.out_channels, k, strides=s, padding=spec.flax_padding,
                         kernel_dilation=d, method=method, param_dtype=dtype)


class Decoder3D(nn.Module):
    config: Decoder3DConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        *ups, head = (_layer(spec, self.config.conv_method, dtype_of(self.param_dtype))
                      for spec in self.config.conv_transposes())
        self.ups, self.head = ups, head

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        """`train` is accepted for a uniform signature: the decoder has no train-only layers."""
        self.config.check_input(x.shape, channels_last=True)
        for up in self.ups:
            x = nn.relu(up(x))
        return self.head(x)
