"""The Gemma family in PyTorch, the reference: the shared decoder body
(`zoo.models.decoder.torch`) as `GemmaConfig.decoder` configures it, with transformers' module
names (`GemmaForCausalLM`, Gemma 2's post-norms, Gemma 3's `q_norm` / `k_norm`); a tied head
has no module."""

from __future__ import annotations

from zoo.models.decoder.torch import CausalLM


class Gemma(CausalLM):
    pass
