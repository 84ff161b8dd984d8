"""Decoder3D in Equinox: per-sample `(C, D, H, W)` latent."""

from __future__ import annotations

import equinox as eqx
import jax
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.conv_transpose_spec import ConvTransposeSpec
from zoo.layers.eqx import ConvTranspose
from zoo.models.common import dtype_of
from zoo.models.decoder3d.config import Decoder3DConfig


def _layer(spec: ConvTransposeSpec, method: str, key: PRNGKeyArray, dtype) -> ConvTranspose:
    return ConvTranspose(
        3, spec.in_channels, spec.out_channels, (spec.kernel_size,) * 3, stride=spec.stride,
        padding=spec.padding, output_padding=spec.output_padding, dilation=spec.dilation,
        method=method, key=key, dtype=dtype,
    )


class Decoder3D(eqx.Module):
    ups: tuple[ConvTranspose, ...]
    head: ConvTranspose
    config: Decoder3DConfig = eqx.field(static=True)

    def __init__(self, config: Decoder3DConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        specs = config.conv_transposes()
        keys = jax.random.split(key, len(specs))
        *ups, self.head = (_layer(spec, config.conv_method, k, dtype_of(dtype))
                           for spec, k in zip(specs, keys, strict=True))
        self.ups = tuple(ups)
        self.config = config

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        self.config.check_input(x.shape, batched=False)
        for up in self.ups:
            x = jax.nn.relu(up(x))
        return self.head(x)
