"""ConvNeXt (v1 and v2) with timm's parameter names: stem.0/1, stages.i.downsample.0/1,
stages.i.blocks.j (conv_dw, norm, mlp.fc1, mlp.grn, mlp.fc2, gamma), head.norm, head.fc."""

from zoo.models.convnext.config import ConvNeXtConfig
from zoo.registry import register

register(ConvNeXtConfig, eqx=".eqx:ConvNeXt", linen=".linen:ConvNeXt", nnx=".nnx:ConvNeXt",
         torch=".torch:ConvNeXt")
