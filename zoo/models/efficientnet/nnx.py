"""EfficientNet in Flax NNX: batched `(N, H, W, C)` input, statistics in `nnx.BatchStat`
variables; the blocks are `zoo.models.mbconv.nnx`'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.drop_path import block_keys
from zoo.models.common import activation, dtype_of
from zoo.models.efficientnet.config import EfficientNetConfig
from zoo.models.intermediates import MAPS, check_format, permutation, take_indices
from zoo.models.mbconv.nnx import batch_norm, blocks, conv, run_stage, sample_keys


class EfficientNet(nnx.Module):
    def __init__(self, config: EfficientNetConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.config = config
        self.conv_stem = conv(config, config.in_channels, config.stem_chs, 3, 2, dt, rngs)
        self.bn1 = batch_norm(config, config.stem_chs, dt, rngs)
        self.blocks = blocks(config, dt, rngs)
        self.conv_head = conv(config, config.block_chs, config.head_chs, 1, 1, dt, rngs)
        self.bn2 = batch_norm(config, config.head_chs, dt, rngs)
        self.classifier = nnx.Linear(config.features, config.num_classes, param_dtype=dt,
                                     rngs=rngs)
        self.dropout = nnx.Dropout(config.drop_rate)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        """Logits; in training (`model.train()`) the drop paths and the dropout draw from
        `rngs` (a raw key draws the masks the Equinox model draws from it)."""
        x = self.forward_intermediates(x, indices=1, rngs=rngs)[0]
        if isinstance(rngs, jax.Array):
            rngs = block_keys(rngs, sum(map(len, self.blocks)))
        return self.forward_head(x, rngs=rngs)

    def forward_features(self, x: jax.Array) -> jax.Array:
        """The head conv's feature map `(N, H', W', C')` (after bn2 and the activation),
        before pooling (timm's)."""
        return self.forward_intermediates(x, indices=1)[0]

    def forward_intermediates(
            self, x: jax.Array, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NHWC",
            intermediates_only: bool = False, *, rngs: Any = None,
    ) -> list[jax.Array] | tuple[jax.Array, list[jax.Array]]:
        """timm's: `(features, taps)` or, with `intermediates_only`, the taps: the feature maps
        at `config.stage_ends` (0: after the stem, i: after stage i - 1), channels-last by
        default ("NHWC"; "NCHW" is timm's layout). `indices`: the last n taps (int), those
        listed, or all (None); `stop_early` skips the stages after the last one taken (and then
        the head conv, as timm's); `norm` changes nothing."""
        del norm
        ends = self.config.stage_ends
        take, last = take_indices(len(ends), indices)
        take, last = [ends[i] for i in take], ends[last]
        check_format(output_fmt, MAPS)
        self.config.check_input(x.shape, channels_last=True)
        act = activation(self.config.act)
        keys = sample_keys(self.config, x, rngs, not self.dropout.deterministic)
        x = act(self.bn1(self.conv_stem(x)))
        taps = [x] if 0 in take else []
        stages = len(self.blocks) if not stop_early else last
        for i in range(stages):
            x = run_stage(self.blocks, i, x, keys)
            if i + 1 in take:
                taps.append(x)
        taps = [t.transpose(permutation("NHWC", output_fmt)) for t in taps]
        if intermediates_only:
            return taps
        if stages == len(self.blocks):
            x = act(self.bn2(self.conv_head(x)))
        return x, taps

    def reset_classifier(self, num_classes: int, *, rngs: nnx.Rngs) -> None:
        """A new classifier for `num_classes`, initialised by NNX (in place, as timm's; the
        config follows)."""
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        self.classifier = nnx.Linear(self.config.features, num_classes,
                                     param_dtype=self.classifier.kernel.dtype, rngs=rngs)

    def forward_head(self, x: jax.Array, pre_logits: bool = False, *,
                     rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        """Logits of a feature map: global average pool, dropout, classifier (`pre_logits`:
        the pooled features)."""
        x = self.dropout(jnp.mean(x, axis=(1, 2)), rngs=rngs)
        return x if pre_logits else self.classifier(x)
