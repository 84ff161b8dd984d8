"""Foreign layouts as data: one `Adapter` per layout (renames, prefixes, q/k/v fuse and split,
value changes, left-out keys, scanned layers), applied to a checkpoint's keys before matching,
chosen by content (which adapter's rules cover the keys), and written back with `--layout` (the
torch format) where every value change has an inverse: HF transformers' ViT, DINOv2, CLIP and
SigLIP image towers and Swin, big_vision's ViT (read only), torchvision's ConvNeXt,
EfficientNet and MobileNetV3; and the hub folders' `config.json` readers
(`converters.adapters.config_readers`: HF transformers' ViT, DINOv2, CLIP and SigLIP image
towers, Swin and language models (`hf_lm`: gpt2, llama, mistral, qwen2, qwen3; `hf_gemma`:
gemma, gemma2, gemma3_text; `hf_phi3`: phi3; `hf_moe`: mixtral, qwen3_moe, with the layouts of
their per-expert files; `hf_bert`: bert, roberta; `hf_clip_model`: the two-tower clip and siglip,
with their layouts), timm, the zoo's own).

One module per source family (`hf_vit`, `hf_dinov2`, `hf_clip`, `hf_swin`, `big_vision`); a
new layout is one `Adapter` value and one `register` call below, a new hub family one
`HubReader` subclass registered with `converters.adapters.config_readers.register`.
`to_canonical_names` is the one place a foreign state dict is renamed: the checkpoint readers
(the command line, `converters.load`) and `converters.import_state` both call it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from converters.adapters import config_readers
from converters.adapters.adapter import (
    Adapter,
    AdapterError,
    Drop,
    Fuse,
    Rename,
    Split,
    Stack,
    Transform,
)
from converters.adapters.big_vision import BIG_VISION_VIT
from converters.adapters.hf_bert import READERS as ENCODER_READERS
from converters.adapters.hf_clip import (
    HF_CLIP_VISION,
    HF_SIGLIP_VISION,
    HFCLIPVisionReader,
    HFSiglipVisionReader,
)
from converters.adapters.hf_clip_model import HF_CLIP_MODEL, HF_SIGLIP_MODEL
from converters.adapters.hf_clip_model import READERS as TWO_TOWER_READERS
from converters.adapters.hf_dinov2 import HF_DINOV2, HF_DINOV2_MODULES, HFDinov2Reader
from converters.adapters.hf_gemma import READERS as GEMMA_READERS
from converters.adapters.hf_lm import READERS as LM_READERS
from converters.adapters.hf_moe import HF_MIXTRAL, HF_QWEN3_MOE
from converters.adapters.hf_moe import READERS as MOE_READERS
from converters.adapters.hf_phi3 import READERS as PHI3_READERS
from converters.adapters.hf_swin import HF_SWIN, HF_SWIN_MODULES, HFSwinReader
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


def to_canonical_names(state: Mapping[str, Any], arch: str | None
                       ) -> tuple[dict[str, Any], Adapter | None, list[str]]:
    """`state` under the zoo's canonical names of `arch`, by the adapter whose rules cover its
    keys (`find`); `(state, None, [])` as it is when none does. Returns the adapter and one
    note per reason a key was left out (`Drop`)."""
    adapter = find(state, arch)
    if adapter is None:
        return dict(state), None, []
    out = adapter.to_zoo(state)
    reasons = Counter(adapter.dropped(state).values())
    notes = [f"left out {n} key(s) of the {adapter.description} layout: {reason}"
             for reason, n in reasons.items()]
    return out, adapter, notes


for _adapter in (HF_VIT, HF_VIT_MODULES, HF_DINOV2, HF_DINOV2_MODULES, HF_CLIP_VISION,
                 HF_SIGLIP_VISION, HF_SWIN, HF_SWIN_MODULES, BIG_VISION_VIT, TORCHVISION_CONVNEXT,
                 TORCHVISION_EFFICIENTNET, TORCHVISION_MOBILENET_V3_LARGE,
                 TORCHVISION_MOBILENET_V3_SMALL, HF_MIXTRAL, HF_QWEN3_MOE, HF_CLIP_MODEL,
                 HF_SIGLIP_MODEL):
    register(_adapter)
for _reader in (HFViTReader(), HFDinov2Reader(), HFCLIPVisionReader(), HFSiglipVisionReader(),
                HFSwinReader(), TimmReader(), *LM_READERS, *GEMMA_READERS, *PHI3_READERS,
                *MOE_READERS, *ENCODER_READERS, *TWO_TOWER_READERS, ZooReader()):
    config_readers.register(_reader)

__all__ = ["Adapter", "AdapterError", "Drop", "Fuse", "Rename", "Split", "Stack", "Transform",
           "adapters", "find", "get", "hub", "register", "to_canonical_names"]
