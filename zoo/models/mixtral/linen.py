"""The mixture-of-experts family in Flax Linen: the shared decoder body
(`zoo.models.decoder.linen`) as `MixtralConfig.decoder` configures it; batched token ids
`(N, L)`."""

from __future__ import annotations

from zoo.models.decoder.linen import CausalLM
from zoo.models.mixtral.config import MixtralConfig


class Mixtral(CausalLM):
    config: MixtralConfig
