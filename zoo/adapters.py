"""Adapters: timm's `pretrained` adaptations of a checkpoint to a model of another shape.

An architecture's config declares its adaptations in `ADAPTERS`, each an `Adapter` that owns a
few canonical keys and rewrites the checkpoint's arrays for them when their shapes differ from
the target config's: a new classifier, a resampled position embedding, a first convolution for
another number of input channels. `zoo.weights.adapt` runs them; nothing here names an
architecture. Every adapter returns one line per change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from zoo.configs import Config, ConfigError
from zoo.layers import pos_embed as layers_pos_embed

Arrays = dict[str, np.ndarray]


class Adapter(Protocol):
    """Rewrites `state`'s arrays for the keys it owns so that they fit `target` (the fresh
    canonical state of the target config); returns the new state and one line per change."""

    def __call__(self, state: Arrays, target: Arrays, config: Config
                 ) -> tuple[Arrays, list[str]]: ...


def _shape(a: Any) -> tuple[int, ...]:
    return tuple(np.shape(a))


@dataclass(frozen=True)
class ResetClassifier:
    """A classifier (`prefix.weight`, `prefix.bias`) of another size is re-initialised, as timm
    does for another `num_classes` (the target's fresh arrays, from its seed); a target without
    one (num_classes 0) drops the checkpoint's, as timm's `load_pretrained`."""

    prefix: str

    def __call__(self, state: Arrays, target: Arrays, config: Config
                 ) -> tuple[Arrays, list[str]]:
        keys = [k for k in target if k.startswith(self.prefix + ".")]
        if not keys:  # no classifier in the target (num_classes 0): timm drops the file's
            had = [k for k in state if k.startswith(self.prefix + ".")]
            if not had:
                return state, []
            return ({k: v for k, v in state.items() if k not in had},
                    [f"dropped {self.prefix} (the model has no classifier: num_classes 0)"])
        if all(k in state and _shape(state[k]) == _shape(target[k]) for k in keys):
            return state, []
        was = {_shape(state[k])[0] for k in keys if k in state and _shape(state[k])}
        classes = f" (the checkpoint has {was.pop()})" if len(was) == 1 else ""
        return ({**state, **{k: target[k] for k in keys}},
                [f"re-initialised {self.prefix} for {_shape(target[keys[0]])[0]} "
                 f"classes{classes}"])


def adapt_input_conv(in_channels: int, weight: np.ndarray) -> np.ndarray:
    """timm's `adapt_input_conv`: a conv weight `(out, in, kh, kw)` for `in_channels` inputs.

    One channel sums the RGB filters (groups of 3 summed when there are more); other counts
    repeat the RGB filters cyclically, scaled by `3 / in_channels`.
    """
    w = np.asarray(weight, np.float32)
    out, cin, kh, kw = w.shape
    if in_channels == 1:
        w = (w.reshape(out, cin // 3, 3, kh, kw).sum(axis=2) if cin > 3 and cin % 3 == 0
             else w.sum(axis=1, keepdims=True))
    elif in_channels != cin:
        if cin != 3:
            raise ConfigError(f"cannot adapt a first convolution of {cin} input channels to "
                              f"{in_channels} (timm's rule adapts RGB filters)")
        w = np.tile(w, (1, math.ceil(in_channels / 3), 1, 1))[:, :in_channels]
        w = w * (3 / float(in_channels))
    return w.astype(np.asarray(weight).dtype)


@dataclass(frozen=True)
class AdaptInputConv:
    """The first convolution (`key`, an `(out, in, kh, kw)` weight) for another number of
    input channels, by timm's `adapt_input_conv`."""

    key: str

    def __call__(self, state: Arrays, target: Arrays, config: Config
                 ) -> tuple[Arrays, list[str]]:
        have, want = _shape(state.get(self.key)), _shape(target[self.key])
        if self.key not in state or have == want or have[:1] + have[2:] != want[:1] + want[2:]:
            return state, []  # missing or otherwise shaped: validation names it
        return ({**state, self.key: adapt_input_conv(want[1], state[self.key])},
                [f"adapted {self.key} from {have[1]} to {want[1]} input channels"])


def resample_pos_embed(pos_embed: np.ndarray, grid: tuple[int, int], prefix: int,
                       old_grid: tuple[int, int] | None = None) -> np.ndarray:
    """timm's `resample_abs_pos_embed`: a `(1, prefix + rows * cols, width)` position embedding
    resampled to `grid`, bicubic with antialiasing (as timm's, i.e. PyTorch's
    `interpolate(..., antialias=True)`), the `prefix` (class / register) tokens kept aside.
    `old_grid` defaults to a square one, as timm's (`zoo.layers.pos_embed`, which the models
    with `dynamic_img_size` call)."""
    pe = np.asarray(pos_embed)
    patches = pe.shape[1] - prefix
    if old_grid is None:
        side = math.isqrt(patches)
        if side * side != patches:
            raise ConfigError(f"pos_embed has {patches} patch positions: not a square grid")
        old_grid = (side, side)
    out = layers_pos_embed.resample_pos_embed(pe.astype(np.float32), grid, old_grid, prefix)
    return np.asarray(out).astype(pe.dtype)


@dataclass(frozen=True)
class ResamplePosEmbed:
    """A learned position embedding (`key`) for another image size: resampled to the target
    config's patch grid (its attribute `grid`), the leading tokens that are not patches kept."""

    key: str
    grid: str = "grid"

    def __call__(self, state: Arrays, target: Arrays, config: Config
                 ) -> tuple[Arrays, list[str]]:
        have, want = _shape(state.get(self.key)), _shape(target[self.key])
        if self.key not in state or have == want or len(have) != 3 or have[2] != want[2]:
            return state, []
        grid = tuple(getattr(config, self.grid))
        prefix = want[1] - grid[0] * grid[1]
        resampled = resample_pos_embed(state[self.key], grid, prefix)
        return ({**state, self.key: resampled},
                [f"resampled {self.key} from {have[1] - prefix} to {grid[0]}x{grid[1]} "
                 f"patch positions (bicubic, {prefix} prefix tokens kept)"])

