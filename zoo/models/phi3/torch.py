"""The Phi-3 family in PyTorch, the reference: the shared decoder body
(`zoo.models.decoder.torch`) as `Phi3Config.decoder` configures it, with transformers' module
names (`Phi3ForCausalLM`: `self_attn.qkv_proj`, `mlp.gate_up_proj`)."""

from __future__ import annotations

from zoo.models.decoder.torch import CausalLM


class Phi3(CausalLM):
    pass
