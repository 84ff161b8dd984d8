"""The mixture-of-experts family in Equinox: the shared decoder body
(`zoo.models.decoder.eqx`) as `MixtralConfig.decoder` configures it; one sequence `(L,)` per
call, an explicit `KVCache` for decoding (`init_cache`)."""

from __future__ import annotations

import equinox as eqx

from zoo.layers.eqx import Linear
from zoo.models.decoder.eqx import CausalLM, Decoder
from zoo.models.mixtral.config import MixtralConfig


class Mixtral(CausalLM):
    model: Decoder
    lm_head: Linear | None  # None: tied to model.embed_tokens
    config: MixtralConfig = eqx.field(static=True)
