"""UNet3D in Flax NNX: batched `(N, D, H, W, C)` input, statistics in `nnx.BatchStat`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.conv import conv_general_dilated
from zoo.layers.conv_transpose_spec import ConvTransposeSpec
from zoo.layers.nnx import ConvTranspose
from zoo.layers.pooling import max_pool
from zoo.models.common import dtype_of
from zoo.models.unet3d.config import UNet3DConfig

K3 = (3, 3, 3)


def _norm(config: UNet3DConfig, channels: int, dtype, rngs: nnx.Rngs) -> nnx.Module:
    if config.norm == "batch":
        return nnx.BatchNorm(channels, momentum=config.bn_momentum, epsilon=config.norm_eps,
                             use_fast_variance=False, param_dtype=dtype, rngs=rngs)
    return nnx.GroupNorm(channels, num_groups=config.groups, epsilon=config.norm_eps,
                         use_fast_variance=False, param_dtype=dtype, rngs=rngs)


class ConvBlock(nnx.Module):
    """Two conv3x3x3 (no bias) + norm + relu."""

    def __init__(self, config: UNet3DConfig, cin: int, cout: int, dtype, rngs: nnx.Rngs) -> None:
        conv = lambda i: nnx.Conv(i, cout, K3, padding=((1, 1),) * 3, use_bias=False,
                                  param_dtype=dtype, conv_general_dilated=conv_general_dilated,
                                  rngs=rngs)
        self.conv1, self.norm1 = conv(cin), _norm(config, cout, dtype, rngs)
        self.conv2, self.norm2 = conv(cout), _norm(config, cout, dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.norm1(self.conv1(x)))
        return nnx.relu(self.norm2(self.conv2(x)))


def _up(spec: ConvTransposeSpec, method: str, dtype, rngs: nnx.Rngs) -> ConvTranspose:
    k, s, _, _, d = spec.per_dim
    return ConvTranspose(spec.in_channels, spec.out_channels, k, s, padding=spec.flax_padding,
                         kernel_dilation=d, method=method, param_dtype=dtype, rngs=rngs)


class UNet3D(nnx.Module):
    def __init__(self, config: UNet3DConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt, w = dtype_of(param_dtype), config.widths
        self.config = config
        ins = (config.in_channels, *w[:-2])
        self.encoders = nnx.List([ConvBlock(config, i, o, dt, rngs)
                                  for i, o in zip(ins, w[:-1], strict=True)])
        self.downs = nnx.List([nnx.Conv(c, c, (2, 2, 2), strides=(2, 2, 2), padding="VALID",
                                        param_dtype=dt, rngs=rngs)
                               for c in w[:-1]] if config.down == "conv" else [])
        self.bottleneck = ConvBlock(config, w[-2], w[-1], dt, rngs)
        self.ups = nnx.List([_up(spec, config.conv_method, dt, rngs)
                             for spec in config.conv_transposes()])
        self.decoders = nnx.List([ConvBlock(config, 2 * c, c, dt, rngs)
                                  for c in config.decoder_widths()])
        self.head = nnx.Conv(w[0], config.out_channels, (1, 1, 1), param_dtype=dt,
                             conv_general_dilated=conv_general_dilated, rngs=rngs)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        self.config.check_input(x.shape, channels_last=True)
        skips = []
        for i, encoder in enumerate(self.encoders):
            x = encoder(x)
            skips.append(x)
            x = self.downs[i](x) if self.downs else max_pool(x, (2, 2, 2), (2, 2, 2))
        x = self.bottleneck(x)
        for up, decoder, skip in zip(self.ups, self.decoders, reversed(skips), strict=True):
            x = decoder(jnp.concatenate([skip, up(x)], axis=-1))  # CONCAT_ORDER
        return self.head(x)
