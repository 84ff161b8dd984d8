"""Adapters: timm's `pretrained` adaptations of a checkpoint to a model of another shape.

An architecture's config declares its adaptations in `ADAPTERS`, each an `Adapter` that owns a
few canonical keys and rewrites the checkpoint's arrays for them when their shapes differ from
the target config's: a new classifier, a resampled position embedding, a first convolution for
another number of input channels. `zoo.weights.loading.adapt` runs them; nothing here names an
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


def _geometric_positions(src: int, dst: int) -> list[float]:
    """timm's `_calc` (BEiT's): the `src` source offsets spread geometrically so that the
    outermost lands near `dst // 2`."""
    left, right = 1.01, 1.5
    while right - left > 1e-6:
        q = (left + right) / 2.0
        if (1.0 - q ** (src // 2)) / (1.0 - q) > dst // 2:
            right = q
        else:
            left = q
    dis, cur = [], 1.0
    for i in range(src // 2):
        dis.append(cur)
        cur += q ** (i + 1)
    return [-d for d in reversed(dis)] + [0.0] + dis


def _interpolate_linear(points: tuple[np.ndarray, np.ndarray], values: np.ndarray,
                        at: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """timm's `RegularGridInterpolator` (linear on an uneven grid, the edge values beyond it),
    in float32 as timm computes it."""
    idxs, dists, overall = [], [], []
    for p, x in zip(points, at, strict=True):
        right = np.minimum(np.searchsorted(p, x, side="left"), len(p) - 1)
        left = np.clip(right - 1, 0, len(p) - 1)
        d_left, d_right = np.maximum(x - p[left], 0), np.maximum(p[right] - x, 0)
        both = (d_left == 0) & (d_right == 0)
        d_left, d_right = np.where(both, 1, d_left), np.where(both, 1, d_right)
        idxs.append((left, right))
        dists.append((d_left.astype(np.float32), d_right.astype(np.float32)))
        overall.append((d_left + d_right).astype(np.float32))
    out = np.zeros(at[0].shape, np.float32)
    for a in (0, 1):
        for b in (0, 1):
            out = out + values[idxs[0][a], idxs[1][b]] * (dists[0][1 - a] * dists[1][1 - b])
    return out / (overall[0] * overall[1])


def resize_rel_pos_bias_table(table: np.ndarray, window: tuple[int, int]) -> np.ndarray:
    """timm's `resize_rel_pos_bias_table` (without SciPy, its default) of a flat
    `((2 wh - 1) * (2 ww - 1), heads)` relative position bias table for `window`: the source
    window is square (or, when the table cannot be, the destination's); each head's table is
    resampled linearly from BEiT's geometric grid of source offsets. An unchanged size is
    returned as it is."""
    t = np.asarray(table)
    dst = (2 * window[0] - 1, 2 * window[1] - 1)
    count = t.shape[0]
    side = math.isqrt(count)
    if side * side == count:
        src = (side, side)
    elif count == dst[0] * dst[1]:
        src = dst
    else:
        raise ConfigError(f"a relative position bias table of {count} rows is of no square "
                          "window: its window cannot be inferred")
    if src == dst:
        return t
    y, x = (np.asarray(_geometric_positions(s, d), np.float32)
            for s, d in zip(src, dst, strict=True))
    dy, dx = (np.arange(-(d // 2), d // 2 + 0.1, 1.0, dtype=np.float32) for d in dst)
    at = np.meshgrid(dy, dx, indexing="ij")
    heads = [_interpolate_linear((y, x), t[:, h].reshape(src).astype(np.float32), at)
             for h in range(t.shape[1])]
    return np.stack([r.reshape(-1) for r in heads], axis=-1).astype(t.dtype)


@dataclass(frozen=True)
class ResampleRelPosBias:
    """Relative position bias tables (every key ending in `suffix`) for another window (another
    window size, or an image size that changes a stage's window): resized by timm's
    `resize_rel_pos_bias_table` to the window the config gives the key's layer (its method
    `table_window(key)`), as timm's Swin loads a checkpoint (also when that window is not
    square)."""

    suffix: str
    window: str = "table_window"

    def __call__(self, state: Arrays, target: Arrays, config: Config
                 ) -> tuple[Arrays, list[str]]:
        out, changed = dict(state), set()
        for key in target:
            if not key.endswith(self.suffix) or key not in state:
                continue
            have, want = _shape(state[key]), _shape(target[key])
            window = tuple(getattr(config, self.window)(key))
            if (len(have) != 2 or have[1:] != want[1:]
                    or (have == want and window[0] == window[1])):
                continue  # the same table, or another layer: validation names it
            out[key] = resize_rel_pos_bias_table(state[key], window)
            if _shape(out[key]) != have or not np.array_equal(out[key], state[key]):
                changed.add((have[0], want[0], window))
        return out, [f"resized the {self.suffix}s from {a} to {b} positions (window "
                     f"{w[0]}x{w[1]})" for a, b, w in sorted(changed)]
