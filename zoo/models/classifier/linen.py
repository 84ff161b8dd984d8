"""timm's classifier API for Flax Linen models (`zoo.models.classifier`): call the methods
with `module.apply(variables, x, method="forward_features")`; `reset_classifier` returns a new
`(module, variables)`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.models.common import dtype_of
from zoo.models.intermediates import MAPS, check_format, permutation


class Classifier(nn.Module):
    """Subclassed by a model whose classifier is the Dense at `CLASSIFIER`; the model writes
    `forward_intermediates` (timm's: `(features, taps)`) and `pre_logits` (the classifier's
    input from the features). Keywords (`train=`, ...) pass through to them."""

    CLASSIFIER: ClassVar[str] = "classifier"

    def forward_features(self, x: jax.Array, **kwargs: Any) -> jax.Array:
        """The features before the head (timm's): `forward_intermediates`' features."""
        return self.forward_intermediates(x, indices=1, **kwargs)[0]

    def forward_head(self, x: jax.Array, pre_logits: bool = False, **kwargs: Any) -> jax.Array:
        """Logits of `forward_features`' output (`pre_logits`: the classifier's input)."""
        x = self.pre_logits(x, **kwargs)
        if pre_logits:
            return x
        fc = self
        for name in self.CLASSIFIER.split("."):
            fc = getattr(fc, name)
        return fc(x)

    def reset_classifier(self, variables: Any, num_classes: int, *, key: jax.Array
                         ) -> tuple[nn.Module, Any]:
        """`(module, variables)` whose classifier is a fresh Flax Dense for `num_classes` (and
        whose config says so); this module and `variables` are not changed."""
        dt = dtype_of(self.param_dtype)
        dense = nn.Dense(num_classes, param_dtype=dt, parent=None)
        new = dense.init(key, jnp.zeros((1, self.config.features), dt))["params"]
        params = _replace(variables["params"], self.CLASSIFIER.split("."), new)
        config = dataclasses.replace(self.config, num_classes=num_classes)
        return self.clone(config=config), {**variables, "params": params}


def _replace(tree: Any, path: list[str], value: Any) -> dict[str, Any]:
    """`tree` with the entry at `path` replaced by `value` (new dicts on the way down)."""
    name, *rest = path
    return {**tree, name: _replace(tree[name], rest, value) if rest else value}


class StagedClassifier(Classifier):
    """A Classifier of feature maps made by a stem and stages (timm's CNNs), whose
    `forward_intermediates` this writes: the model writes `forward_stem` (the stem's tap and
    the first stage's input), `forward_stage`, optionally `forward_end` (what follows the last
    stage) and `stage_arguments`, and its config `taps` (timm's tap positions) and
    `num_stages`. The call's keywords (`train=`, ...) go to `forward_stem` and `forward_end`,
    `stage_arguments`' to `forward_stage`."""

    def forward_intermediates(
            self, x: jax.Array, indices: int | Sequence[int] | None = None,
            norm: bool = False, stop_early: bool = False, output_fmt: str = "NHWC",
            intermediates_only: bool = False, **kwargs: Any) -> Any:
        """timm's: `(forward_features(x), taps)` or, `intermediates_only`, the taps: the
        feature maps at `config.taps`' positions (0: the stem's, i: stage i - 1's output),
        channels-last by default ("NHWC"; "NCHW" is timm's layout). `indices`: the last n taps
        (int), those listed, or all (None); `stop_early` skips the stages after the last one
        taken (and then `forward_end`); `norm` changes nothing (no norm before the head, as
        timm's). Call it with `module.apply(variables, x, method="forward_intermediates",
        ...)`."""
        del norm
        take, last = self.config.taps(indices, stop_early, intermediates_only)
        check_format(output_fmt, MAPS)
        self.config.check_input(x.shape, channels_last=True)
        arguments = self.stage_arguments(x, **kwargs)
        tap, x = self.forward_stem(x, **kwargs)
        taps = [tap] if 0 in take else []
        stages = last if stop_early else self.config.num_stages
        for i in range(stages):
            x = self.forward_stage(i, x, **arguments)
            if i + 1 in take:
                taps.append(x)
        taps = [t.transpose(permutation("NHWC", output_fmt)) for t in taps]
        if intermediates_only:
            return taps
        return (self.forward_end(x, **kwargs) if stages == self.config.num_stages else x), taps

    def stage_arguments(self, x: jax.Array, **kwargs: Any) -> dict[str, Any]:
        """`forward_stage`'s keywords in a call on `x` with `kwargs`: those (a model draws
        its per-call randomness here)."""
        return kwargs

    def forward_end(self, x: jax.Array, **kwargs: Any) -> jax.Array:
        """The features from the last stage's output: that output (a model may add layers)."""
        return x
