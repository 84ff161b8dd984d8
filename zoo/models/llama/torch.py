"""The Llama family in PyTorch, the reference: the shared decoder body
(`zoo.models.decoder.torch`) as `LlamaConfig.decoder` configures it, with transformers' module
names (`LlamaForCausalLM`, Qwen3's `q_norm` / `k_norm`); a tied head has no module."""

from __future__ import annotations

from zoo.models.decoder.torch import CausalLM


class Llama(CausalLM):
    pass
