"""The Swin Transformer's configuration, and the window geometry every library shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from zoo.configs import Config, ConfigError, positive
from zoo.weights.adaptation import Adapter, AdaptInputConv, ResampleRelPosBias, ResetClassifier

MASKED = -100.0  # the attention logit added between tokens of different shifted regions


def _named() -> dict[str, dict[str, Any]]:
    """timm's Swin v1 names (`swin_{size}_patch4_window{w}_{image}`)."""
    small = {"depths": (2, 2, 18, 2)}
    base = {"embed_dim": 128, "depths": (2, 2, 18, 2), "num_heads": (4, 8, 16, 32)}
    return {"swin_tiny_patch4_window7_224": {},
            "swin_small_patch4_window7_224": small,
            "swin_base_patch4_window7_224": base,
            "swin_base_patch4_window12_384": {**base, "window_size": 12,
                                              "image_size": (384, 384)}}


@dataclass(frozen=True)
class SwinConfig(Config):
    """timm's `SwinTransformer` (v1): a patch embedding with a LayerNorm, stages of blocks
    attending within windows (every second block's windows shifted by half a window, the
    tokens of different regions masked apart), a relative position bias per head, patch
    merging between stages (2x2 neighbours concatenated, normalised, projected to twice the
    width), a final LayerNorm, an average pool and a linear head.

    The defaults are timm's `swin_tiny_patch4_window7_224`; the names and meanings are timm's
    (`embed_dim`, `depths`, `num_heads` per stage, `window_size`, `mlp_ratio`, `qkv_bias`,
    `drop_path_rate`: stochastic depth in training, rising linearly over all blocks to 0.1,
    timm's default). As in timm, a stage whose resolution is not larger than the window takes
    its resolution as the window and does not shift; a resolution that is not a multiple of
    the window is padded at the end (the padded tokens take part in the attention); an odd
    resolution is padded before patch merging. `num_classes` 0: no head (the pooled features
    are the output).
    """

    arch: ClassVar[str] = "swin"
    REFERENCES: ClassVar[dict[str, str]] = {
        "timm's SwinTransformer": "tests/test_swin.py",
        "timm's keys, shapes and parameter counts": "tests/test_named_models.py",
        "transformers' Swin": "tests/test_hf_towers.py",
    }
    # A stage over a 6x4 grid: its height padded to two windows of 4 and shifted, its width one
    # window, not shifted (the per-axis rule); patch merging into a 3x2 stage whose window
    # shrinks to it. (tests/test_swin.py runs more shapes against timm.)
    TINY: ClassVar[dict[str, Any]] = {
        "image_size": (12, 8), "patch_size": 2, "embed_dim": 8, "depths": (2, 1),
        "num_heads": (1, 2), "window_size": 4, "mlp_ratio": 2.0, "num_classes": 5,
        "drop_path_rate": 0.0}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = _named()
    # timm's pretrained adaptations: a new head for another num_classes, the relative position
    # bias tables resized for another window (another image_size or window_size), the patch
    # projection for another in_channels.
    ADAPTERS: ClassVar[tuple[Adapter, ...]] = (
        ResetClassifier("head.fc"), ResampleRelPosBias("relative_position_bias_table"),
        AdaptInputConv("patch_embed.proj.weight"))
    HEADLESS: ClassVar[dict[str, Any]] = {"num_classes": 0}  # timm's headless model
    LOSS: ClassVar[str] = "cross_entropy"
    image_size: tuple[int, int] = (224, 224)
    patch_size: int = 4
    in_channels: int = 3
    embed_dim: int = 96
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 7
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    num_classes: int = 1000
    norm_eps: float = 1e-5  # timm's Swin uses PyTorch's LayerNorm default
    global_pool: Literal["avg"] = "avg"
    drop_path_rate: float = 0.1

    def validate(self) -> None:
        if len(self.image_size) != 2:
            raise ConfigError(f"swin.image_size must have 2 entries, found {self.image_size}")
        positive("swin sizes", (*self.image_size, self.patch_size, self.in_channels,
                                self.embed_dim, self.window_size, *self.depths,
                                *self.num_heads))
        if not self.depths or len(self.depths) != len(self.num_heads):
            raise ConfigError(f"swin.depths {self.depths} and num_heads {self.num_heads} need "
                              "one entry per stage")
        if any(s < self.patch_size for s in self.image_size):
            raise ConfigError(f"swin.image_size {self.image_size} is smaller than one patch "
                              f"({self.patch_size})")
        for i, heads in enumerate(self.num_heads):
            if self.stage_dim(i) % heads:
                raise ConfigError(f"swin stage {i}: width {self.stage_dim(i)} is not a "
                                  f"multiple of num_heads {heads}")
        if self.mlp_ratio <= 0 or int(self.embed_dim * self.mlp_ratio) < 1:
            raise ConfigError(f"swin.mlp_ratio must give a positive hidden size, found "
                              f"{self.mlp_ratio}")
        if self.num_classes < 0:
            raise ConfigError(f"swin.num_classes must be >= 0 (0: no head), found "
                              f"{self.num_classes}")
        if not self.norm_eps > 0:
            raise ConfigError(f"swin.norm_eps must be positive, found {self.norm_eps}")
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise ConfigError(f"swin.drop_path_rate must be in [0, 1), found "
                              f"{self.drop_path_rate}")

    # ------------------------------------------------------------------ geometry
    @property
    def num_stages(self) -> int:
        return len(self.depths)

    def stage_dim(self, i: int) -> int:
        """The width of stage `i`: `embed_dim * 2**i`."""
        return self.embed_dim * 2 ** i

    @property
    def num_features(self) -> int:
        """The last stage's width: the pooled features."""
        return self.stage_dim(self.num_stages - 1)

    @property
    def grid(self) -> tuple[int, int]:
        """The patch grid (rows, columns) of `image_size`."""
        return (self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size)

    def resolution(self, i: int) -> tuple[int, int]:
        """The token grid of stage `i` (after its patch merging): halved per stage, rounded
        up (an odd side is padded before merging)."""
        h, w = self.grid
        for _ in range(i):
            h, w = (h + 1) // 2, (w + 1) // 2
        return (h, w)

    def window(self, i: int) -> tuple[int, int]:
        """Stage `i`'s window (rows, columns): `window_size`, or the resolution where that is
        not larger (timm's `_calc_window_shift`)."""
        return tuple(r if r <= self.window_size else self.window_size
                     for r in self.resolution(i))

    def shift(self, i: int) -> tuple[int, int]:
        """The shift of stage `i`'s odd blocks: half the window, 0 along an axis whose
        resolution fits in one window."""
        return tuple(0 if r <= w else self.window_size // 2
                     for r, w in zip(self.resolution(i), self.window(i), strict=True))

    def block_shift(self, i: int, j: int) -> tuple[int, int]:
        """The shift of block `j` of stage `i`: none for even blocks."""
        return (0, 0) if j % 2 == 0 else self.shift(i)

    def table_window(self, key: str) -> tuple[int, int]:
        """The window of the layer holding canonical `key` (`layers.{i}.`...): its stage's."""
        return self.window(int(key.split(".")[1]))

    def mlp_hidden(self, i: int) -> int:
        return int(self.stage_dim(i) * self.mlp_ratio + 1e-6)  # see ViTConfig.mlp_hidden

    def drop_path_rates(self) -> tuple[tuple[float, ...], ...]:
        """Each block's drop path rate per stage: `linspace(0, drop_path_rate, all blocks)`
        split by stage, as timm's."""
        total = sum(self.depths)
        rates = [self.drop_path_rate * k / (total - 1) if total > 1 else 0.0
                 for k in range(total)]
        out, start = [], 0
        for d in self.depths:
            out.append(tuple(rates[start:start + d]))
            start += d
        return tuple(out)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.image_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.num_classes or self.num_features,)


# ---------------------------------------------------------------------- derived buffers
# What timm holds as non-persistent buffers (`relative_position_index`, `attn_mask`): derived
# from the config, never learned, so they are no part of the canonical state; every library
# computes them here, as NumPy constants, when it traces a call.
def relative_position_index(window: tuple[int, int]) -> np.ndarray:
    """timm's `get_relative_position_index`: `(area, area)` indices into the bias table of
    each pair of a window's tokens (row-major)."""
    wh, ww = window
    coords = np.stack(np.meshgrid(np.arange(wh), np.arange(ww), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0)
    return (rel[..., 0] + wh - 1) * (2 * ww - 1) + (rel[..., 1] + ww - 1)


def window_partition(x: np.ndarray, window: tuple[int, int]) -> np.ndarray:
    """`(..., H, W, C)` -> `(..., windows, wh * ww, C)`, windows row-major (timm's order)."""
    *lead, h, w, c = x.shape
    wh, ww = window
    x = x.reshape(*lead, h // wh, wh, w // ww, ww, c)
    n = len(lead)
    x = x.transpose(*range(n), n, n + 2, n + 1, n + 3, n + 4)
    return x.reshape(*lead, (h // wh) * (w // ww), wh * ww, c)


def window_reverse(windows: np.ndarray, window: tuple[int, int], size: tuple[int, int]
                   ) -> np.ndarray:
    """The inverse of `window_partition`: `(..., windows, wh * ww, C)` -> `(..., H, W, C)`
    for a grid of `size` (H, W)."""
    *lead, _, _, c = windows.shape
    (wh, ww), (h, w) = window, size
    x = windows.reshape(*lead, h // wh, w // ww, wh, ww, c)
    n = len(lead)
    x = x.transpose(*range(n), n, n + 2, n + 1, n + 3, n + 4)
    return x.reshape(*lead, h, w, c)


def merge_patches(x: np.ndarray) -> np.ndarray:
    """timm's `PatchMerging` rearrangement: `(..., H, W, C)` (odd sides padded with zeros at
    the end) -> `(..., ceil(H/2), ceil(W/2), 4C)`, each 2x2 neighbourhood's channels ordered
    by column offset, then row offset (the original x0, x1, x2, x3)."""
    *lead, h, w, c = x.shape
    n = len(lead)
    if h % 2 or w % 2:
        pad = [(0, 0)] * n + [(0, h % 2), (0, w % 2), (0, 0)]
        x = _pad(x, pad)
        h, w = h + h % 2, w + w % 2
    x = x.reshape(*lead, h // 2, 2, w // 2, 2, c)
    x = x.transpose(*range(n), n, n + 2, n + 3, n + 1, n + 4)
    return x.reshape(*lead, h // 2, w // 2, 4 * c)


def _pad(x: Any, pad: list[tuple[int, int]]) -> Any:
    """Zero padding with the array's own library (NumPy or JAX)."""
    if isinstance(x, np.ndarray):
        return np.pad(x, pad)
    import jax.numpy as jnp

    return jnp.pad(x, pad)


def attention_mask(padded: tuple[int, int], window: tuple[int, int],
                   shift: tuple[int, int]) -> np.ndarray | None:
    """timm's `get_attn_mask`: `(windows, area, area)`, 0 between tokens of one region of the
    shifted (and padded) grid, `MASKED` otherwise; None without a shift."""
    if not any(shift):
        return None
    img = np.zeros((*padded, 1), np.float32)
    cnt = 0
    for h in ((0, -window[0]), (-window[0], -shift[0]), (-shift[0], None)):
        for w in ((0, -window[1]), (-window[1], -shift[1]), (-shift[1], None)):
            img[h[0]:h[1], w[0]:w[1], :] = cnt
            cnt += 1
    regions = window_partition(img, window)[..., 0]  # (windows, area)
    diff = regions[:, None, :] - regions[:, :, None]
    return np.where(diff != 0, np.float32(MASKED), np.float32(0.0))


def padded(resolution: tuple[int, int], window: tuple[int, int]) -> tuple[int, int]:
    """The resolution padded up to whole windows."""
    return tuple(-(-r // w) * w for r, w in zip(resolution, window, strict=True))
