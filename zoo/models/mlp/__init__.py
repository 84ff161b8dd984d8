"""3-layer MLP: fc1 -> act -> fc2 -> act -> fc3."""

from zoo.models.mlp.config import MLPConfig
from zoo.registry import register

register(MLPConfig, eqx=".eqx:MLP", linen=".linen:MLP", nnx=".nnx:MLP", torch=".torch:MLP")
