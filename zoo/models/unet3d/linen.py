"""UNet3D in Flax Linen: batched `(N, D, H, W, C)` input, statistics in `batch_stats`."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.layers.conv import conv_general_dilated
from zoo.layers.conv_transpose_spec import ConvTransposeSpec
from zoo.layers.linen import ConvTranspose
from zoo.layers.pooling import max_pool
from zoo.models.common import dtype_of
from zoo.models.unet3d.config import UNet3DConfig

K3 = (3, 3, 3)


def _norm(config: UNet3DConfig, dtype) -> nn.Module:
    if config.norm == "batch":
        return nn.BatchNorm(momentum=config.bn_momentum, epsilon=config.norm_eps,
                            use_fast_variance=False, param_dtype=dtype)
    return nn.GroupNorm(num_groups=config.groups, epsilon=config.norm_eps,
                        use_fast_variance=False, param_dtype=dtype)


def _normalise(norm: nn.Module, x: jax.Array, train: bool) -> jax.Array:
    """BatchNorm takes the mode at call time; GroupNorm has none."""
    return norm(x, use_running_average=not train) if isinstance(norm, nn.BatchNorm) else norm(x)


class ConvBlock(nn.Module):
    """Two conv3x3x3 (no bias) + norm + relu."""

    config: UNet3DConfig
    features: int
    param_dtype: str = "float32"

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        conv = lambda: nn.Conv(self.features, K3, padding=((1, 1),) * 3, use_bias=False,
                               param_dtype=dt, conv_general_dilated=conv_general_dilated)
        self.conv1, self.norm1 = conv(), _norm(self.config, dt)
        self.conv2, self.norm2 = conv(), _norm(self.config, dt)

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        for conv, norm in ((self.conv1, self.norm1), (self.conv2, self.norm2)):
            x = nn.relu(_normalise(norm, conv(x), train))
        return x


def _up(spec: ConvTransposeSpec, method: str, dtype) -> ConvTranspose:
    k, s, _, _, d = spec.per_dim
    return ConvTranspose(spec.out_channels, k, strides=s, padding=spec.flax_padding,
                         kernel_dilation=d, method=method, param_dtype=dtype)


class UNet3D(nn.Module):
    config: UNet3DConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        block = lambda c: ConvBlock(cfg, c, self.param_dtype)
        self.encoders = [block(c) for c in cfg.widths[:-1]]
        self.downs = [nn.Conv(c, (2, 2, 2), strides=(2, 2, 2), padding="VALID", param_dtype=dt)
                      for c in cfg.widths[:-1]] if cfg.down == "conv" else []
        self.bottleneck = block(cfg.widths[-1])
        self.ups = [_up(spec, cfg.conv_method, dt) for spec in cfg.conv_transposes()]
        self.decoders = [block(c) for c in cfg.decoder_widths()]
        self.head = nn.Conv(cfg.out_channels, (1, 1, 1), param_dtype=dt,
                            conv_general_dilated=conv_general_dilated)

    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        self.config.check_input(x.shape, channels_last=True)
        skips = []
        for i, encoder in enumerate(self.encoders):
            x = encoder(x, train=train)
            skips.append(x)
            x = self.downs[i](x) if self.downs else max_pool(x, (2, 2, 2), (2, 2, 2))
        x = self.bottleneck(x, train=train)
        for up, decoder, skip in zip(self.ups, self.decoders, reversed(skips), strict=True):
            x = decoder(jnp.concatenate([skip, up(x)], axis=-1), train=train)  # CONCAT_ORDER
        return self.head(x)
