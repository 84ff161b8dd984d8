"""timm's classifier API for Flax Linen models (`zoo.models.classifier`): call the methods
with `module.apply(variables, x, method="forward_features")`; `reset_classifier` returns a new
`(module, variables)`."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.models.common import dtype_of


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
