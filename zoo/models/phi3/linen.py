"""The Phi-3 family in Flax Linen: the shared decoder body (`zoo.models.decoder.linen`) as
`Phi3Config.decoder` configures it; batched token ids `(N, L)`."""

from __future__ import annotations

from zoo.models.decoder.linen import CausalLM
from zoo.models.phi3.config import Phi3Config


class Phi3(CausalLM):
    config: Phi3Config
