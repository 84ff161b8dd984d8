"""The decoder-only language model body that GPT-2, the Llama family and the next families
configure (`DecoderSpec`), written once per library: `eqx`, `linen`, `nnx`, `torch`."""

from zoo.models.decoder.spec import (
    AttentionSpec,
    DecoderSpec,
    LayerAttention,
    MLPSpec,
    MoESpec,
    Names,
    PoolSpec,
)

__all__ = ["AttentionSpec", "DecoderSpec", "LayerAttention", "MLPSpec", "MoESpec", "Names",
           "PoolSpec"]
