"""ResNet with torchvision's parameter names: conv1, bn1, layer1..layer4 of BasicBlock or
Bottleneck (downsample.0/1 projections), global average pool, fc."""

from zoo.models.resnet.config import ResNetConfig
from zoo.registry import register

register(ResNetConfig, eqx=".eqx:ResNet", linen=".linen:ResNet", nnx=".nnx:ResNet",
         torch=".torch:ResNet")
