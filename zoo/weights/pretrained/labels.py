"""Class names of the label sets pretrained tags predict: ImageNet-1k's as data in the repository
(`data/imagenet-1k.json`: WordNet synsets and timm's descriptions, generated from timm's
`ImageNetInfo` by ``python -m zoo.weights.pretrained.generate`` and checked by a test). Other sets
(ImageNet-21k, -22k, -12k) are read from timm where it is installed."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from zoo.configs import ConfigError

LABELS = {"imagenet-1k": Path(__file__).parent / "data" / "imagenet-1k.json"}


@functools.cache
def label_names(label_set: str) -> tuple[str, ...]:
    """The class names of `label_set`, index by index ("tench, Tinca tinca", ...)."""
    if label_set in LABELS:
        return tuple(json.loads(LABELS[label_set].read_text())["names"])
    try:
        from timm.data import ImageNetInfo
    except ImportError:
        raise ConfigError(f"the names of label set {label_set!r} are not shipped with the zoo "
                          "(ImageNet-1k's are): install timm to read them") from None
    try:
        return tuple(ImageNetInfo(label_set).label_descriptions())
    except (AssertionError, OSError, ValueError):
        raise ConfigError(f"unknown label set {label_set!r}; shipped: {sorted(LABELS)}"
                          ) from None
