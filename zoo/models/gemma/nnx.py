"""The Gemma family in Flax NNX: the shared decoder body (`zoo.models.decoder.nnx`) as
`GemmaConfig.decoder` configures it; batched token ids `(N, L)`, a tied head
`embed_tokens.attend`, `init_cache` for decoding."""

from __future__ import annotations

from zoo.models.decoder.nnx import CausalLM


class Gemma(CausalLM):
    pass
