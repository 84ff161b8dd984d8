"""The Phi-3 family in Flax NNX: the shared decoder body (`zoo.models.decoder.nnx`) as
`Phi3Config.decoder` configures it; batched token ids `(N, L)`, `init_cache` for decoding."""

from __future__ import annotations

from zoo.models.decoder.nnx import CausalLM


class Phi3(CausalLM):
    pass
