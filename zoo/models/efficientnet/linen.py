"""EfficientNet in Flax Linen: batched `(N, H, W, C)` input, statistics in `batch_stats`; the
blocks are `zoo.models.mbconv.linen`'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.models.common import activation, dtype_of
from zoo.models.efficientnet.config import EfficientNetConfig
from zoo.models.intermediates import MAPS, check_format, permutation, take_indices
from zoo.models.mbconv.linen import batch_norm, blocks, conv, run_stage, sample_keys


class EfficientNet(nn.Module):
    config: EfficientNetConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        self.conv_stem = conv(cfg, cfg.stem_chs, 3, 2, dt)
        self.bn1 = batch_norm(cfg, dt)
        self.blocks = blocks(cfg, self.param_dtype)
        self.conv_head = conv(cfg, cfg.head_chs, 1, 1, dt)
        self.bn2 = batch_norm(cfg, dt)
        self.classifier = nn.Dense(cfg.num_classes, param_dtype=dt)
        self.dropout = nn.Dropout(cfg.drop_rate)

    def __call__(self, x: jax.Array, *, train: bool = False,
                 key: jax.Array | None = None) -> jax.Array:
        """Logits; in training the drop paths draw from `key` (one raw key: the masks the
        Equinox and NNX models draw from it) or the "dropout" stream, as the dropout does."""
        x = self.forward_intermediates(x, indices=1, train=train, key=key)[0]
        return self.forward_head(x, train=train)

    def forward_features(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        """The head conv's feature map `(N, H', W', C')` (after bn2 and the activation),
        before pooling (timm's); call it with `module.apply(variables, x,
        method="forward_features")`."""
        return self.forward_intermediates(x, indices=1, train=train)[0]

    def forward_intermediates(
            self, x: jax.Array, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NHWC",
            intermediates_only: bool = False, *, train: bool = False,
            key: jax.Array | None = None) -> Any:
        """timm's: `(features, taps)` or, with `intermediates_only`, the taps: the feature maps
        at `config.stage_ends` (0: after the stem, i: after stage i - 1), channels-last by
        default ("NHWC"; "NCHW" is timm's layout). `indices`: the last n taps (int), those
        listed, or all (None); `stop_early` skips the stages after the last one taken (and then
        the head conv, as timm's); `norm` changes nothing. Call it with `module.apply(
        variables, x, method="forward_intermediates", ...)`."""
        del norm
        ends = self.config.stage_ends
        take, last = take_indices(len(ends), indices)
        take, last = [ends[i] for i in take], ends[last]
        check_format(output_fmt, MAPS)
        self.config.check_input(x.shape, channels_last=True)
        act, ura = activation(self.config.act), not train
        keys = sample_keys(self, self.config, x, train, key)
        x = act(self.bn1(self.conv_stem(x), use_running_average=ura))
        taps = [x] if 0 in take else []
        stages = len(self.blocks) if not stop_early else last
        for i in range(stages):
            x = run_stage(self.blocks, i, x, train, keys)
            if i + 1 in take:
                taps.append(x)
        taps = [t.transpose(permutation("NHWC", output_fmt)) for t in taps]
        if intermediates_only:
            return taps
        if stages == len(self.blocks):
            x = act(self.bn2(self.conv_head(x), use_running_average=ura))
        return x, taps

    def reset_classifier(self, variables: Any, num_classes: int, *, key: jax.Array
                         ) -> tuple[nn.Module, Any]:
        """`(module, variables)` whose classifier is a fresh Flax Dense for `num_classes`
        (and whose config says so); this module and `variables` are not changed."""
        config = dataclasses.replace(self.config, num_classes=num_classes)
        dense = nn.Dense(num_classes, param_dtype=dtype_of(self.param_dtype), parent=None)
        new = dense.init(key, jnp.zeros((1, self.config.features), dtype_of(self.param_dtype)))
        params = {**variables["params"], "classifier": new["params"]}
        return self.clone(config=config), {**variables, "params": params}

    def forward_head(self, x: jax.Array, pre_logits: bool = False, *,
                     train: bool = False) -> jax.Array:
        """Logits of a feature map: global average pool, dropout, classifier (`pre_logits`:
        the pooled features)."""
        x = self.dropout(jnp.mean(x, axis=(1, 2)), deterministic=not train)
        return x if pre_logits else self.classifier(x)
