"""MobileNetV3 in Flax Linen: batched `(N, H, W, C)` input, statistics in `batch_stats`; the
blocks are `zoo.models.mbconv.linen`'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.models.common import activation, dtype_of
from zoo.models.intermediates import MAPS, check_format, permutation, take_indices
from zoo.models.mbconv.linen import batch_norm, blocks, conv, run_stage, sample_keys
from zoo.models.mobilenetv3.config import MobileNetV3Config


class MobileNetV3(nn.Module):
    config: MobileNetV3Config
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        self.conv_stem = conv(cfg, cfg.stem_chs, 3, 2, dt)
        self.bn1 = batch_norm(cfg, dt)
        self.blocks = blocks(cfg, self.param_dtype)
        self.conv_head = conv(cfg, cfg.num_features, 1, 1, dt, bias=True)
        self.classifier = nn.Dense(cfg.num_classes, param_dtype=dt)
        self.dropout = nn.Dropout(cfg.drop_rate)

    def __call__(self, x: jax.Array, *, train: bool = False,
                 key: jax.Array | None = None) -> jax.Array:
        """Logits; in training the drop paths draw from `key` (one raw key: the masks the
        Equinox and NNX models draw from it) or the "dropout" stream, as the dropout does."""
        x = self.forward_intermediates(x, indices=1, train=train, key=key)[0]
        return self.forward_head(x, train=train)

    def forward_features(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        """The last stage's feature map `(N, H', W', C')`, before the efficient head (timm's);
        call it with `module.apply(variables, x, method="forward_features")`."""
        return self.forward_intermediates(x, indices=1, train=train)[0]

    def forward_intermediates(
            self, x: jax.Array, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NHWC",
            intermediates_only: bool = False, *, train: bool = False,
            key: jax.Array | None = None) -> Any:
        """timm's: `(features, taps)` or, with `intermediates_only`, the taps: the feature maps
        at `config.stage_ends` (0: after the stem, i: after stage i - 1), channels-last by
        default ("NHWC"; "NCHW" is timm's layout). `indices`: the last n taps (int), those
        listed, or all (None); `stop_early` (with `intermediates_only`, as timm's) skips the
        stages after the last one taken; `norm` changes nothing. Call it with
        `module.apply(variables, x, method="forward_intermediates", ...)`."""
        del norm
        ends = self.config.stage_ends
        take, last = take_indices(len(ends), indices)
        take, last = [ends[i] for i in take], ends[last]
        check_format(output_fmt, MAPS)
        if stop_early and not intermediates_only:
            raise ValueError("forward_intermediates: stop_early needs intermediates_only=True "
                             "(as timm's MobileNetV3)")
        self.config.check_input(x.shape, channels_last=True)
        keys = sample_keys(self, self.config, x, train, key)
        x = self.bn1(self.conv_stem(x), use_running_average=not train)
        x = activation(self.config.act)(x)
        taps = [x] if 0 in take else []
        for i in range(last if stop_early else len(self.blocks)):
            x = run_stage(self.blocks, i, x, train, keys)
            if i + 1 in take:
                taps.append(x)
        taps = [t.transpose(permutation("NHWC", output_fmt)) for t in taps]
        return taps if intermediates_only else (x, taps)

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
        """Logits of a feature map: global average pool, conv_head, act, dropout, classifier
        (`pre_logits`: before the classifier)."""
        x = self.conv_head(jnp.mean(x, axis=(1, 2), keepdims=True))
        x = activation(self.config.act)(x).reshape(x.shape[0], -1)
        x = self.dropout(x, deterministic=not train)
        return x if pre_logits else self.classifier(x)
