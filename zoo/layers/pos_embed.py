"""Position embeddings resampled to another patch grid, as timm's `resample_abs_pos_embed`:
in a model at call time (timm's `dynamic_img_size`) and on loading a checkpoint
(`zoo.weights.adaptation.ResamplePosEmbed`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array

__all__ = ["resample_pos_embed"]


def resample_pos_embed(pos_embed: Array, grid: tuple[int, int], old_grid: tuple[int, int],
                       prefix: int) -> Array:
    """A `(1, prefix + rows * cols, width)` position embedding laid out on `old_grid`,
    resampled to `grid`: bicubic with antialiasing (timm's default, i.e. PyTorch's
    `interpolate(..., mode="bicubic", antialias=True)`: Keys' kernel with a = -0.5, weights
    renormalised at the borders), computed in float32; the `prefix` rows (class and register
    tokens) are kept aside. The same grid gives `pos_embed` itself, as timm's."""
    grid, old_grid = tuple(int(g) for g in grid), tuple(int(g) for g in old_grid)
    if grid == old_grid:
        return pos_embed
    width = pos_embed.shape[-1]
    image = pos_embed[0, prefix:].reshape(*old_grid, width).astype(jnp.float32)
    new = jax.image.resize(image, (*grid, width), "bicubic", antialias=True)
    new = new.reshape(1, -1, width).astype(pos_embed.dtype)
    return jnp.concatenate([pos_embed[:, :prefix], new], axis=1)
