"""MobileNetV3 in Flax NNX: batched `(N, H, W, C)` input, statistics in `nnx.BatchStat`
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
from zoo.models.intermediates import MAPS, check_format, permutation, take_indices
from zoo.models.mbconv.nnx import batch_norm, blocks, conv, run_stage, sample_keys
from zoo.models.mobilenetv3.config import MobileNetV3Config


class MobileNetV3(nnx.Module):
    def __init__(self, config: MobileNetV3Config, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.config = config
        self.conv_stem = conv(config, config.in_channels, config.stem_chs, 3, 2, dt, rngs)
        self.bn1 = batch_norm(config, config.stem_chs, dt, rngs)
        self.blocks = blocks(config, dt, rngs)
        self.conv_head = conv(config, config.block_chs, config.num_features, 1, 1, dt, rngs,
                              bias=True)
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
        """The last stage's feature map `(N, H', W', C')`, before the efficient head
        (timm's)."""
        return self.forward_intermediates(x, indices=1)[0]

    def forward_intermediates(
            self, x: jax.Array, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NHWC",
            intermediates_only: bool = False, *, rngs: Any = None,
    ) -> list[jax.Array] | tuple[jax.Array, list[jax.Array]]:
        """timm's: `(features, taps)` or, with `intermediates_only`, the taps: the feature maps
        at `config.stage_ends` (0: after the stem, i: after stage i - 1), channels-last by
        default ("NHWC"; "NCHW" is timm's layout). `indices`: the last n taps (int), those
        listed, or all (None); `stop_early` (with `intermediates_only`, as timm's) skips the
        stages after the last one taken; `norm` changes nothing."""
        del norm
        ends = self.config.stage_ends
        take, last = take_indices(len(ends), indices)
        take, last = [ends[i] for i in take], ends[last]
        check_format(output_fmt, MAPS)
        if stop_early and not intermediates_only:
            raise ValueError("forward_intermediates: stop_early needs intermediates_only=True "
                             "(as timm's MobileNetV3)")
        self.config.check_input(x.shape, channels_last=True)
        keys = sample_keys(self.config, x, rngs, not self.dropout.deterministic)
        x = activation(self.config.act)(self.bn1(self.conv_stem(x)))
        taps = [x] if 0 in take else []
        for i in range(last if stop_early else len(self.blocks)):
            x = run_stage(self.blocks, i, x, keys)
            if i + 1 in take:
                taps.append(x)
        taps = [t.transpose(permutation("NHWC", output_fmt)) for t in taps]
        return taps if intermediates_only else (x, taps)

    def reset_classifier(self, num_classes: int, *, rngs: nnx.Rngs) -> None:
        """A new classifier for `num_classes`, initialised by NNX (in place, as timm's; the
        config follows)."""
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        self.classifier = nnx.Linear(self.config.features, num_classes,
                                     param_dtype=self.classifier.kernel.dtype, rngs=rngs)

    def forward_head(self, x: jax.Array, pre_logits: bool = False, *,
                     rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        """Logits of a feature map: global average pool, conv_head, act, dropout, classifier
        (`pre_logits`: before the classifier)."""
        x = self.conv_head(jnp.mean(x, axis=(1, 2), keepdims=True))
        x = activation(self.config.act)(x).reshape(x.shape[0], -1)
        x = self.dropout(x, rngs=rngs)
        return x if pre_logits else self.classifier(x)
