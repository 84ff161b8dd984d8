"""Swin Transformer v1 with timm's parameter names: patch embedding with a LayerNorm, stages of
(shifted) window attention with relative position biases, patch merging, final LayerNorm,
average pool, linear head."""

from zoo.models.swin.config import SwinConfig
from zoo.registry import register

register(SwinConfig, eqx=".eqx:Swin", linen=".linen:Swin", nnx=".nnx:Swin",
         torch=".torch:Swin")
