"""3-D U-Net: encoder stages (two conv3x3x3 + norm + relu, then down-sampling), a bottleneck,
decoder stages (ConvTranspose3d up-sampling, skip concatenated first on channels, two convs) and
a 1x1x1 head."""

from zoo.models.unet3d.config import UNet3DConfig
from zoo.registry import register

register(UNet3DConfig, eqx=".eqx:UNet3D", linen=".linen:UNet3D", nnx=".nnx:UNet3D",
         torch=".torch:UNet3D")
