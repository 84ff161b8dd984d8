"""EfficientNet in Equinox: per-sample `(C, H, W)` input, BatchNorm statistics in
`eqx.nn.State`; the blocks are `zoo.models.mbconv.eqx`'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.drop_path import block_keys
from zoo.layers.eqx import BatchNorm, Linear, with_new_head
from zoo.models.common import activation, dtype_of
from zoo.models.efficientnet.config import EfficientNetConfig
from zoo.models.intermediates import MAPS, check_format, permutation, take_indices
from zoo.models.mbconv.eqx import Block, batch_norm, blocks, conv, run_stage

State = eqx.nn.State


class EfficientNet(eqx.Module):
    has_state: ClassVar[bool] = True  # zoo.create returns (model, state)

    conv_stem: eqx.nn.Conv2d
    bn1: BatchNorm
    blocks: tuple[tuple[Block, ...], ...]
    conv_head: eqx.nn.Conv2d
    bn2: BatchNorm
    classifier: Linear
    dropout: eqx.nn.Dropout
    config: EfficientNetConfig = eqx.field(static=True)

    def __init__(self, config: EfficientNetConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        dt = dtype_of(dtype)
        k_stem, k_blocks, k_head, k_fc = jax.random.split(key, 4)
        self.conv_stem = conv(config, config.in_channels, config.stem_chs, 3, 2, k_stem, dt)
        self.bn1 = batch_norm(config, config.stem_chs, dt)
        self.blocks = blocks(config, k_blocks, dt)
        self.conv_head = conv(config, config.block_chs, config.head_chs, 1, 1, k_head, dt)
        self.bn2 = batch_norm(config, config.head_chs, dt)
        self.classifier = Linear(config.features, config.num_classes, key=k_fc, dtype=dt)
        self.dropout = eqx.nn.Dropout(config.drop_rate)
        self.config = config

    def __call__(self, x: Array, state: State, *,
                 key: PRNGKeyArray | None = None) -> tuple[Array, State]:
        """Logits of one image; `key` (training) draws the drop paths and the dropout."""
        features, state = self._features(x, state, key=key)
        head_key = None if key is None else block_keys(key, sum(map(len, self.blocks)))
        return self.forward_head(features, key=head_key), state

    def _features(self, x: Array, state: State, *,
                  key: PRNGKeyArray | None) -> tuple[Array, State]:
        (x, _), state = self.forward_intermediates(x, state, indices=1, key=key)
        return x, state

    def forward_features(self, x: Array, state: State) -> tuple[Array, State]:
        """The head conv's feature map `(C', H', W')` of one image (after bn2 and the
        activation), before pooling (timm's)."""
        return self._features(x, state, key=None)

    def forward_intermediates(
            self, x: Array, state: State, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW",
            intermediates_only: bool = False, *, key: PRNGKeyArray | None = None,
    ) -> tuple[Any, State]:
        """timm's, per image, with the state: `((features, taps), state)` or, with
        `intermediates_only`, `(taps, state)`; the taps are the feature maps at
        `config.stage_ends` (0: after the stem, i: after stage i - 1), each `(C, H, W)` for
        `output_fmt` "NCHW" (the default) or `(H, W, C)` for "NHWC". `indices`: the last n taps
        (int), those listed, or all (None); `stop_early` skips the stages after the last one
        taken (and then the head conv, as timm's); `norm` changes nothing."""
        del norm
        ends = self.config.stage_ends
        take, last = take_indices(len(ends), indices)
        take, last = [ends[i] for i in take], ends[last]
        check_format(output_fmt, MAPS)
        self.config.check_input(x.shape, batched=False)
        act = activation(self.config.act)
        x, state = self.bn1(self.conv_stem(x), state)
        x = act(x)
        taps = [x] if 0 in take else []
        stages = len(self.blocks) if not stop_early else last
        for i in range(stages):
            x, state = run_stage(self.blocks, i, x, state, key)
            if i + 1 in take:
                taps.append(x)
        perm = permutation("NCHW", output_fmt, batched=False)
        taps = [t.transpose(perm) for t in taps]
        if intermediates_only:
            return taps, state
        if stages == len(self.blocks):
            x, state = self.bn2(self.conv_head(x), state)
            x = act(x)
        return (x, taps), state

    def reset_classifier(self, num_classes: int, *, key: PRNGKeyArray) -> EfficientNet:
        """A new model whose classifier is a fresh Equinox Linear for `num_classes` (and whose
        config says so); this one is not changed."""
        return with_new_head(self, "classifier", self.config.features, num_classes, key=key)

    def forward_head(self, x: Array, pre_logits: bool = False, *,
                     key: PRNGKeyArray | None = None) -> Array:
        """Logits of a feature map: global average pool, dropout, classifier (`pre_logits`:
        the pooled features)."""
        x = self.dropout(jnp.mean(x, axis=(1, 2)), key=key)
        return x if pre_logits else self.classifier(x)
