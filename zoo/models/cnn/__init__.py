"""The Flax MNIST CNN: conv [bn] relu pool, conv [bn] relu pool, fc1 [dropout] relu, fc2."""

from zoo.models.cnn.config import CNNConfig
from zoo.registry import register

register(CNNConfig, eqx=".eqx:CNN", linen=".linen:CNN", nnx=".nnx:CNN", torch=".torch:CNN")
