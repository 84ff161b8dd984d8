"""GPT-2 in Flax NNX: the shared decoder body (`zoo.models.decoder.nnx`) as
`GPT2Config.decoder` configures it; batched token ids `(N, L)`, the tied head `wte.attend`,
`init_cache` for decoding."""

from __future__ import annotations

from zoo.models.decoder.nnx import CausalLM


class GPT2(CausalLM):
    pass
