"""GPT-2 in Flax Linen: the shared decoder body (`zoo.models.decoder.linen`) as
`GPT2Config.decoder` configures it; batched token ids `(N, L)`, the tied head `wte.attend`."""

from __future__ import annotations

from zoo.models.decoder.linen import CausalLM
from zoo.models.gpt2.config import GPT2Config


class GPT2(CausalLM):
    config: GPT2Config
