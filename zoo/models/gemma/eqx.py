"""The Gemma family in Equinox: the shared decoder body (`zoo.models.decoder.eqx`) as
`GemmaConfig.decoder` configures it; one sequence `(L,)` per call, a tied head
`h @ embed_tokens.weight.T`, an explicit `KVCache` for decoding (`init_cache`)."""

from __future__ import annotations

import equinox as eqx

from zoo.layers.eqx import Linear
from zoo.models.decoder.eqx import CausalLM, Decoder
from zoo.models.gemma.config import GemmaConfig


class Gemma(CausalLM):
    model: Decoder
    lm_head: Linear | None  # None: tied to model.embed_tokens
    config: GemmaConfig = eqx.field(static=True)
