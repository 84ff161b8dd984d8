"""The mixture-of-experts family in Flax NNX: the shared decoder body
(`zoo.models.decoder.nnx`) as `MixtralConfig.decoder` configures it; batched token ids
`(N, L)`, `init_cache` for decoding."""

from __future__ import annotations

from zoo.models.decoder.nnx import CausalLM


class Mixtral(CausalLM):
    pass
