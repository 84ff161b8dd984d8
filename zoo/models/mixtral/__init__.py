"""The mixture-of-experts family (transformers' `MixtralForCausalLM` and
`Qwen3MoeForCausalLM`) through config fields: the Llama body whose MLP is a sparse mixture of
SwiGLU experts (router softmax, top-k, renormalised weights), Qwen3-MoE's q/k norms, own head
and expert sizes and dense layers among the sparse ones; the load-balancing loss in training."""

from zoo.models.mixtral.config import MixtralConfig
from zoo.registry import register

register(MixtralConfig, eqx=".eqx:Mixtral", linen=".linen:Mixtral", nnx=".nnx:Mixtral",
         torch=".torch:Mixtral")
