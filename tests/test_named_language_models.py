"""The named language models (`zoo.list_models("qwen*")`, ...) are the published ones: each
published `config.json` (tests/fixtures/hf_configs/) reads into the named config with no
--arch, and the `transformers` model built from it (meta device: nothing allocated, nothing
downloaded) has the zoo's canonical keys, in its `state_dict()` order, with the same shapes
(its tied head's alias aside) and the parameter count pinned in
tests/fixtures/named_hf_language_models.json, which the zoo's own count equals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import zoo
from converters.adapters import config_readers
from converters.core import canonical_spec

FIXTURES = Path(__file__).parent / "fixtures"
PINNED = {k: v for k, v in json.loads((FIXTURES / "named_hf_language_models.json").read_text())
          .items() if not k.startswith("_")}


def test_every_named_language_model_is_pinned():
    named = {n for arch in ("gpt2", "llama", "gemma", "phi3", "mixtral")
             for n in zoo.architecture(arch).config.NAMED}
    assert named | {"gpt2"} == set(PINNED)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_named_model_is_the_published_one(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    raw = json.loads((FIXTURES / "hf_configs" / f"{name}.json").read_text())
    config = config_readers.reader_for(raw).config(raw, f"{name}.json")
    assert config == zoo.make_config(name)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**raw))
    aliases = {t.alias for t in config.ties}
    theirs = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in aliases}
    ours = {k: tuple(v.shape) for k, v in canonical_spec(config).items()}
    assert list(ours) == list(theirs)
    assert ours == theirs
    count = PINNED[name]["parameters"]
    assert sum(p.numel() for p in model.parameters()) == count
    assert sum(math.prod(s) for s in ours.values()) == count
