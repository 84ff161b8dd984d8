"""UNet3D in Equinox: per-sample `(C, D, H, W)` input; BatchNorm statistics in `eqx.nn.State`
(empty with GroupNorm)."""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.conv_transpose_spec import ConvTransposeSpec
from zoo.layers.eqx import BatchNorm, Conv3d, ConvTranspose, MaxPool3d
from zoo.models.common import dtype_of
from zoo.models.unet3d.config import UNet3DConfig

State = eqx.nn.State
Norm = BatchNorm | eqx.nn.GroupNorm


def _norm(config: UNet3DConfig, channels: int, dtype) -> Norm:
    if config.norm == "batch":
        return BatchNorm(channels, "batch", config.bn_momentum, config.norm_eps, dtype=dtype)
    return eqx.nn.GroupNorm(config.groups, channels, eps=config.norm_eps, dtype=dtype)


class ConvBlock(eqx.Module):
    """Two conv3x3x3 (no bias) + norm + relu."""

    conv1: Conv3d
    norm1: Norm
    conv2: Conv3d
    norm2: Norm

    def __init__(self, config: UNet3DConfig, cin: int, cout: int, *, key: PRNGKeyArray,
                 dtype) -> None:
        k1, k2 = jax.random.split(key)
        conv = lambda i, k: Conv3d(i, cout, (3, 3, 3), padding=1, use_bias=False, key=k,
                                          dtype=dtype)
        self.conv1, self.norm1 = conv(cin, k1), _norm(config, cout, dtype)
        self.conv2, self.norm2 = conv(cout, k2), _norm(config, cout, dtype)

    def __call__(self, x: Array, state: State) -> tuple[Array, State]:
        for conv, norm in ((self.conv1, self.norm1), (self.conv2, self.norm2)):
            x, state = norm(conv(x), state)  # eqx.nn.GroupNorm passes the state through
            x = jax.nn.relu(x)
        return x, state


def _up(spec: ConvTransposeSpec, method: str, key: PRNGKeyArray, dtype) -> ConvTranspose:
    return ConvTranspose(3, spec.in_channels, spec.out_channels, (spec.kernel_size,) * 3,
                         stride=spec.stride, padding=spec.padding,
                         output_padding=spec.output_padding, dilation=spec.dilation,
                         method=method, key=key, dtype=dtype)


class UNet3D(eqx.Module):
    has_state: ClassVar[bool] = True  # zoo.create returns (model, state)

    encoders: tuple[ConvBlock, ...]
    downs: tuple[Conv3d, ...]  # empty with down="maxpool"
    pool: MaxPool3d | None
    bottleneck: ConvBlock
    ups: tuple[ConvTranspose, ...]
    decoders: tuple[ConvBlock, ...]
    head: Conv3d
    config: UNet3DConfig = eqx.field(static=True)

    def __init__(self, config: UNet3DConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        dt, w, n = dtype_of(dtype), config.widths, config.depth
        keys = iter(jax.random.split(key, 4 * n + 2))
        ins = (config.in_channels, *w[:-2])
        self.encoders = tuple(ConvBlock(config, i, o, key=next(keys), dtype=dt)
                              for i, o in zip(ins, w[:-1], strict=True))
        self.downs = tuple(Conv3d(c, c, (2, 2, 2), stride=2, key=next(keys), dtype=dt)
                           for c in w[:-1]) if config.down == "conv" else ()
        self.pool = MaxPool3d(2, 2) if config.down == "maxpool" else None
        self.bottleneck = ConvBlock(config, w[-2], w[-1], key=next(keys), dtype=dt)
        self.ups = tuple(_up(spec, config.conv_method, next(keys), dt)
                         for spec in config.conv_transposes())
        self.decoders = tuple(ConvBlock(config, 2 * c, c, key=next(keys), dtype=dt)
                              for c in config.decoder_widths())
        self.head = Conv3d(w[0], config.out_channels, (1, 1, 1), key=next(keys),
                                  dtype=dt)
        self.config = config

    def __call__(self, x: Array, state: State, *,
                 key: PRNGKeyArray | None = None) -> tuple[Array, State]:
        self.config.check_input(x.shape, batched=False)
        skips = []
        for i, encoder in enumerate(self.encoders):
            x, state = encoder(x, state)
            skips.append(x)
            x = self.pool(x) if self.pool is not None else self.downs[i](x)
        x, state = self.bottleneck(x, state)
        for up, decoder, skip in zip(self.ups, self.decoders, reversed(skips), strict=True):
            x, state = decoder(jnp.concatenate([skip, up(x)], axis=0), state)  # CONCAT_ORDER
        return self.head(x), state
