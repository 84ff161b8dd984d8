"""The Gemma family in Flax Linen: the shared decoder body (`zoo.models.decoder.linen`) as
`GemmaConfig.decoder` configures it; batched token ids `(N, L)`, a tied head
`embed_tokens.attend`."""

from __future__ import annotations

from zoo.models.decoder.linen import CausalLM
from zoo.models.gemma.config import GemmaConfig


class Gemma(CausalLM):
    config: GemmaConfig
