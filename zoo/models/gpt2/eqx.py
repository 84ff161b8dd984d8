"""GPT-2 in Equinox: the shared decoder body (`zoo.models.decoder.eqx`) as
`GPT2Config.decoder` configures it; one sequence `(L,)` per call, the tied head
`h @ wte.weight.T`, an explicit `KVCache` for decoding (`init_cache`)."""

from __future__ import annotations

import equinox as eqx

from zoo.layers.eqx import Linear
from zoo.models.decoder.eqx import CausalLM, Decoder
from zoo.models.gpt2.config import GPT2Config


class GPT2(CausalLM):
    transformer: Decoder
    lm_head: Linear | None  # None: tied to transformer.wte
    config: GPT2Config = eqx.field(static=True)
