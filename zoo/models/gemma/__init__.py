"""The Gemma family (transformers' `GemmaForCausalLM`, `Gemma2ForCausalLM`,
`Gemma3ForCausalLM`: Gemma 1, 2 and 3's text model) through config fields: RMSNorms times
`(1 + weight)`, embeddings scaled by `sqrt(hidden_size)`, GeGLU MLP, tied head; Gemma 2's
post-norms, score and logit soft-capping and alternating sliding-window layers; Gemma 3's q/k
norms and per-layer-type rotary bases."""

from zoo.models.gemma.config import GemmaConfig
from zoo.registry import register

register(GemmaConfig, eqx=".eqx:Gemma", linen=".linen:Gemma", nnx=".nnx:Gemma",
         torch=".torch:Gemma")
