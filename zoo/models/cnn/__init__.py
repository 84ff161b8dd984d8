"""The Flax MNIST CNN: stages `convs.i` [`bns.i`] relu pool, then fc1 [dropout] relu, fc2."""

from zoo.models.cnn.config import CNNConfig
from zoo.registry import register

register(CNNConfig, eqx=".eqx:CNN", linen=".linen:CNN", nnx=".nnx:CNN", torch=".torch:CNN")
