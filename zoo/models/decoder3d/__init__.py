"""3-D decoder: ConvTranspose3d + relu stages (`ups.i`), then a ConvTranspose3d head."""

from zoo.models.decoder3d.config import Decoder3DConfig
from zoo.registry import register

register(Decoder3DConfig, eqx=".eqx:Decoder3D", linen=".linen:Decoder3D",
         nnx=".nnx:Decoder3D", torch=".torch:Decoder3D")
