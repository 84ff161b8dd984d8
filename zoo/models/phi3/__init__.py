"""The Phi-3 family (transformers' `Phi3ForCausalLM`: Phi-3 mini and medium, Phi-3.5 mini)
through config fields: Llama's RMSNorms, grouped-query attention and SwiGLU MLP with the
attention's queries, keys and values in one `qkv_proj` and the MLP's gate and up projections
in one `gate_up_proj`; partial rotary embedding, sliding window, residual and attention
dropout, optional tied head."""

from zoo.models.phi3.config import Phi3Config
from zoo.registry import register

register(Phi3Config, eqx=".eqx:Phi3", linen=".linen:Phi3", nnx=".nnx:Phi3",
         torch=".torch:Phi3")
