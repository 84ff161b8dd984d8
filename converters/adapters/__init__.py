"""Foreign layouts as data: one `Adapter` per layout (renames with exact transforms such as a
reshape, prefixes, q/k/v fuse and split), applied to a checkpoint's keys before matching, chosen
by content (which adapter's rules cover the keys), and written back with `--layout` (the torch
format): HF transformers' ViT, torchvision's ConvNeXt; and the hub folders' `config.json`
readers (`converters.adapters.hub`: HF transformers' ViT and language models (`hf_lm`: gpt2,
llama, mistral, qwen2, qwen3), timm, the zoo's own).

A new layout is one `Adapter` value and one `register` call below; a new hub family one
`HubReader` subclass registered with `converters.adapters.hub.register`.
"""

from __future__ import annotations

from collections.abc import Iterable

from converters.adapters import hub
from converters.adapters.base import Adapter, AdapterError, Fuse, Rename, Reshape, Transform
from converters.adapters.hf_lm import READERS as LM_READERS
from converters.adapters.hf_vit import HF_VIT, HF_VIT_MODULES, HFViTReader
from converters.adapters.timm_hub import TimmReader
from converters.adapters.torchvision_convnext import TORCHVISION_CONVNEXT
from converters.adapters.torchvision_mbconv import (
    TORCHVISION_EFFICIENTNET,
    TORCHVISION_MOBILENET_V3_LARGE,
    TORCHVISION_MOBILENET_V3_SMALL,
)
from converters.adapters.zoo_hub import ZooReader

_ADAPTERS: dict[str, Adapter] = {}


def register(adapter: Adapter) -> Adapter:
    if adapter.name in _ADAPTERS:
        raise ValueError(f"an adapter {adapter.name!r} is registered already")
    _ADAPTERS[adapter.name] = adapter
    return adapter


def adapters() -> dict[str, Adapter]:
    """Every layout adapter by name."""
    return dict(_ADAPTERS)


def get(name: str) -> Adapter:
    """The adapter called `name`; AdapterError listing the known ones otherwise."""
    if name not in _ADAPTERS:
        raise AdapterError(f"unknown layout {name!r}; layouts: {sorted(_ADAPTERS)}")
    return _ADAPTERS[name]


def find(keys: Iterable[str], arch: str | None = None) -> Adapter | None:
    """The adapter whose rules cover most of `keys` (more than half; for `arch` if given)."""
    keys = list(keys)
    scored = [(a.coverage(keys), a) for a in _ADAPTERS.values() if arch in (None, a.arch)]
    best = max(scored, key=lambda s: s[0], default=(0.0, None))
    return best[1] if best[0] > 0.5 else None


for _adapter in (HF_VIT, HF_VIT_MODULES, TORCHVISION_CONVNEXT, TORCHVISION_EFFICIENTNET,
                 TORCHVISION_MOBILENET_V3_LARGE, TORCHVISION_MOBILENET_V3_SMALL):
    register(_adapter)
for _reader in (HFViTReader(), TimmReader(), *LM_READERS, ZooReader()):
    hub.register(_reader)

__all__ = ["Adapter", "AdapterError", "Fuse", "Rename", "Reshape", "Transform", "adapters",
           "find", "get", "hub", "register"]
