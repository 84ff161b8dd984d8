"""The mixture-of-experts family in PyTorch, the reference: the shared decoder body
(`zoo.models.decoder.torch`) as `MixtralConfig.decoder` configures it, with transformers'
module names (`mlp.gate`, `mlp.experts.gate_up_proj` / `down_proj`, Qwen3-MoE's `q_norm` /
`k_norm`)."""

from __future__ import annotations

from zoo.models.decoder.torch import CausalLM


class Mixtral(CausalLM):
    pass
