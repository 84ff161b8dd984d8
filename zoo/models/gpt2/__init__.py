"""GPT-2 (transformers' `GPT2LMHeadModel` names and shapes): token and learned position
embeddings, pre-LayerNorm blocks with fused q/k/v (`Conv1D`, stored `(in, out)`), GELU (tanh),
the final LayerNorm and the head tied to the token embedding."""

from zoo.models.gpt2.config import GPT2Config
from zoo.registry import register

register(GPT2Config, eqx=".eqx:GPT2", linen=".linen:GPT2", nnx=".nnx:GPT2", torch=".torch:GPT2")
