"""MLP: linear layers `layers.0` .. `layers.N` with the activation between them."""

from zoo.models.mlp.config import MLPConfig
from zoo.registry import register

register(MLPConfig, eqx=".eqx:MLP", linen=".linen:MLP", nnx=".nnx:MLP", torch=".torch:MLP")
