"""Vision Transformer (timm's `VisionTransformer` names and shapes): patch embedding, class
token, position embedding, pre-LayerNorm blocks, final LayerNorm, linear head on the class
token."""

from zoo.models.vit.config import ViTConfig
from zoo.registry import register

register(ViTConfig, eqx=".eqx:ViT", linen=".linen:ViT", nnx=".nnx:ViT", torch=".torch:ViT")
