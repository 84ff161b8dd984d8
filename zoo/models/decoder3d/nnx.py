"""Decoder3D in Flax NNX: batched `(N, D, H, W, C)` latent."""

from __future__ import annotations

import jax
from flax import nnx

from zoo.layers.conv_transpose_spec import ConvTransposeSpec
from zoo.layers.nnx import ConvTranspose
from zoo.models.common import dtype_of
from zoo.models.decoder3d.config import Decoder3DConfig


def _layer(spec: ConvTransposeSpec, method: str, dtype, rngs: nnx.Rngs) -> ConvTranspose:
    k, s, _, _, d = spec.per_dim
    return ConvTranspose(spec.in_channels, spec.out_channels, k, s, padding=spec.flax_padding,
                         kernel_dilation=d, method=method, param_dtype=dtype, rngs=rngs)


class Decoder3D(nnx.Module):
    def __init__(self, config: Decoder3DConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        self.config = config
        *ups, head = (_layer(spec, config.conv_method, dtype_of(param_dtype), rngs)
                      for spec in config.conv_transposes())
        self.ups = nnx.List(ups)  # stages first, as PyTorch's state_dict lists them
        self.head = head

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        self.config.check_input(x.shape, channels_last=True)
        for up in self.ups:
            x = nnx.relu(up(x))
        return self.head(x)
