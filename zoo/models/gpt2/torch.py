"""GPT-2 in PyTorch, the reference: the shared decoder body (`zoo.models.decoder.torch`) as
`GPT2Config.decoder` configures it, with transformers' module names (`GPT2LMHeadModel`); the
tied head has no module (`ln_f(h) @ wte.weight.T`)."""

from __future__ import annotations

from zoo.models.decoder.torch import CausalLM


class GPT2(CausalLM):
    pass
