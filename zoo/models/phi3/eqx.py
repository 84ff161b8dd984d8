"""The Phi-3 family in Equinox: the shared decoder body (`zoo.models.decoder.eqx`) as
`Phi3Config.decoder` configures it; one sequence `(L,)` per call, an explicit `KVCache` for
decoding (`init_cache`)."""

from __future__ import annotations

import equinox as eqx

from zoo.layers.eqx import Linear
from zoo.models.decoder.eqx import CausalLM, Decoder
from zoo.models.phi3.config import Phi3Config


class Phi3(CausalLM):
    model: Decoder
    lm_head: Linear | None  # None: tied to model.embed_tokens
    config: Phi3Config = eqx.field(static=True)
