"""The Llama family (transformers' `LlamaForCausalLM` names and shapes): Llama 2 / 3.x,
Mistral (dense, sliding window), Qwen2/2.5 (q/k/v biases) and Qwen3 (per-head q/k RMSNorm,
own head size) through config fields: RMSNorm, rotary embedding in transformers' half-split
convention (Llama 3's rope scaling), grouped-query attention, SwiGLU MLP, optional tied head."""

from zoo.models.llama.config import LlamaConfig
from zoo.registry import register

register(LlamaConfig, eqx=".eqx:Llama", linen=".linen:Llama", nnx=".nnx:Llama",
         torch=".torch:Llama")
