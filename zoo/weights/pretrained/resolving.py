"""What a model name, tag or source names: `resolve` (``resnet50``, ``resnet50.tv_in1k``,
``hf-hub:timm/resnet50.a1_in1k``)."""

from __future__ import annotations

from dataclasses import dataclass

from zoo.configs import CONFIGS, ConfigError, named_models
from zoo.weights.pretrained.table import Pretrained, find, split
from zoo.weights.sources import Source


@dataclass(frozen=True)
class Resolved:
    """What a model name names: a zoo name with its pretrained tag (the default tag when the
    name has none; None when the name has no published weights), or a source."""

    name: str | None
    pretrained: Pretrained | None
    source: Source | None
    tagged: bool = False  # the text named the tag itself

    @property
    def weights(self) -> str:
        """Where the weights are: the source (``hf-hub:...``)."""
        if self.source is not None:
            return str(self.source)
        if self.pretrained is None:
            raise ConfigError(f"{self.name} has no pretrained weights "
                              "(zoo.list_pretrained() lists the names that have)")
        return f"hf-hub:{self.pretrained.hub}"


def resolve(text: str) -> Resolved:
    """The model name, tag or source `text` names (``resnet50``, ``resnet50.tv_in1k``,
    ``hf-hub:timm/resnet50.a1_in1k``); ConfigError for an unknown tag of a known name."""
    source = Source.parse(text)
    if source is not None:
        return Resolved(None, None, source)
    name, tag = split(text, {**named_models(), **dict.fromkeys(CONFIGS)})
    return Resolved(name, find(name, tag), None, tag is not None)
