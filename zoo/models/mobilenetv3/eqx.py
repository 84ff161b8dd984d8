"""MobileNetV3 in Equinox: per-sample `(C, H, W)` input, BatchNorm statistics in
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
from zoo.models.intermediates import MAPS, check_format, permutation, take_indices
from zoo.models.mbconv.eqx import Block, batch_norm, blocks, conv, run_stage
from zoo.models.mobilenetv3.config import MobileNetV3Config

State = eqx.nn.State


class MobileNetV3(eqx.Module):
    has_state: ClassVar[bool] = True  # zoo.create returns (model, state)

    conv_stem: eqx.nn.Conv2d
    bn1: BatchNorm
    blocks: tuple[tuple[Block, ...], ...]
    conv_head: eqx.nn.Conv2d
    classifier: Linear
    dropout: eqx.nn.Dropout
    config: MobileNetV3Config = eqx.field(static=True)

    def __init__(self, config: MobileNetV3Config, *, key: PRNGKeyArray, dtype=None) -> None:
        dt = dtype_of(dtype)
        k_stem, k_blocks, k_head, k_fc = jax.random.split(key, 4)
        self.conv_stem = conv(config, config.in_channels, config.stem_chs, 3, 2, k_stem, dt)
        self.bn1 = batch_norm(config, config.stem_chs, dt)
        self.blocks = blocks(config, k_blocks, dt)
        self.conv_head = conv(config, config.block_chs, config.num_features, 1, 1, k_head, dt,
                              bias=True)
        self.classifier = Linear(config.features, config.num_classes, key=k_fc, dtype=dt)
        self.dropout = eqx.nn.Dropout(config.drop_rate)
        self.config = config

    def __call__(self, x: Array, state: State, *,
                 key: PRNGKeyArray | None = None) -> tuple[Array, State]:
        """Logits of one image; `key` (training) draws the drop paths and the dropout."""
        (x, _), state = self.forward_intermediates(x, state, indices=1, key=key)
        head_key = None if key is None else block_keys(key, sum(map(len, self.blocks)))
        return self.forward_head(x, key=head_key), state

    def forward_features(self, x: Array, state: State) -> tuple[Array, State]:
        """The last stage's feature map `(C', H', W')` of one image, before the efficient
        head (timm's)."""
        (x, _), state = self.forward_intermediates(x, state, indices=1)
        return x, state

    def forward_intermediates(
            self, x: Array, state: State, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW",
            intermediates_only: bool = False, *, key: PRNGKeyArray | None = None,
    ) -> tuple[Any, State]:
        """timm's, per image, with the state: `((features, taps), state)` or, with
        `intermediates_only`, `(taps, state)`; the taps are the feature maps at
        `config.stage_ends` (0: after the stem, i: after stage i - 1), each `(C, H, W)` for
        `output_fmt` "NCHW" (the default) or `(H, W, C)` for "NHWC". `indices`: the last n taps
        (int), those listed, or all (None); `stop_early` (with `intermediates_only`, as
        timm's) skips the stages after the last one taken; `norm` changes nothing."""
        del norm
        ends = self.config.stage_ends
        take, last = take_indices(len(ends), indices)
        take, last = [ends[i] for i in take], ends[last]
        check_format(output_fmt, MAPS)
        if stop_early and not intermediates_only:
            raise ValueError("forward_intermediates: stop_early needs intermediates_only=True "
                             "(as timm's MobileNetV3)")
        self.config.check_input(x.shape, batched=False)
        x, state = self.bn1(self.conv_stem(x), state)
        x = activation(self.config.act)(x)
        taps = [x] if 0 in take else []
        for i in range(last if stop_early else len(self.blocks)):
            x, state = run_stage(self.blocks, i, x, state, key)
            if i + 1 in take:
                taps.append(x)
        perm = permutation("NCHW", output_fmt, batched=False)
        taps = [t.transpose(perm) for t in taps]
        return (taps if intermediates_only else (x, taps)), state

    def reset_classifier(self, num_classes: int, *, key: PRNGKeyArray) -> MobileNetV3:
        """A new model whose classifier is a fresh Equinox Linear for `num_classes` (and whose
        config says so); this one is not changed."""
        return with_new_head(self, "classifier", self.config.features, num_classes, key=key)

    def forward_head(self, x: Array, pre_logits: bool = False, *,
                     key: PRNGKeyArray | None = None) -> Array:
        """Logits of a feature map: global average pool, conv_head, act, dropout, classifier
        (`pre_logits`: before the classifier)."""
        x = self.conv_head(jnp.mean(x, axis=(1, 2), keepdims=True))
        x = self.dropout(activation(self.config.act)(x).reshape(-1), key=key)
        return x if pre_logits else self.classifier(x)
