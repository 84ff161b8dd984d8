"""Models the zoo did not build, written from their public definitions, for the tests of
bringing one's own checkpoint (`converters.matching`).

- `LinenMNIST`: the Flax Linen MNIST example's CNN (flax/examples/mnist/train.py), auto-named
  `Conv_0`, `Conv_1`, `Dense_0`, `Dense_1`, SAME padding, no BatchNorm;
- `NNXMNIST`: the Flax NNX MNIST tutorial's CNN (conv1, batch_norm1, dropout1, conv2,
  batch_norm2, avg_pool, linear1, dropout2, linear2);
- `torch_sequential_mlp`: the PyTorch tutorials' `nn.Sequential` MLP (`0`, `2`, `4`);
- `LinenPair` / `EqxPair`: a user's own architecture written twice, with unrelated names.
"""

from __future__ import annotations

import itertools
from functools import partial

import equinox as eqx
import flax.linen as nn
import jax
from flax import nnx


class LinenMNIST(nn.Module):
    """flax/examples/mnist: the CNN, verbatim."""

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(features=32, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = nn.Conv(features=64, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))  # flatten
        x = nn.Dense(features=256)(x)
        x = nn.relu(x)
        x = nn.Dense(features=10)(x)
        return x


class NNXMNIST(nnx.Module):
    """The Flax NNX MNIST tutorial's CNN, verbatim."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm1 = nnx.BatchNorm(32, rngs=rngs)
        self.dropout1 = nnx.Dropout(rate=0.025, rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm2 = nnx.BatchNorm(64, rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
        self.dropout2 = nnx.Dropout(rate=0.025, rngs=rngs)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x, rngs: nnx.Rngs | None = None):
        x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x), rngs=rngs))))
        x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = nnx.relu(self.dropout2(self.linear1(x), rngs=rngs))
        x = self.linear2(x)
        return x


def torch_sequential_mlp(sizes: tuple[int, ...]):
    """`nn.Sequential(nn.Linear, nn.ReLU, nn.Linear, ...)`: state_dict keys `0.`, `2.`, `4.`."""
    from torch import nn as tnn

    layers: list = []
    for a, b in itertools.pairwise(sizes):
        layers += [tnn.Linear(a, b), tnn.ReLU()]
    return tnn.Sequential(*layers[:-1])


class LinenPair(nn.Module):
    """A user's small CNN in Linen (setup names unrelated to the zoo's)."""

    def setup(self):
        self.stem = nn.Conv(4, (3, 3), padding="SAME")
        self.body = nn.Conv(6, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        self.proj = nn.Dense(16)
        self.out = nn.Dense(3)

    def __call__(self, x):
        x = nn.relu(self.stem(x))
        x = nn.relu(self.body(x))
        return self.out(nn.relu(self.proj(x.reshape(x.shape[0], -1))))


class EqxPair(eqx.Module):
    """The same CNN in Equinox, its layers in a list."""

    layers: list

    def __init__(self, key):
        k = jax.random.split(key, 4)
        self.layers = [eqx.nn.Conv2d(2, 4, 3, padding=1, key=k[0]),
                       eqx.nn.Conv2d(4, 6, 3, stride=2, padding=1, key=k[1]),
                       eqx.nn.Linear(6 * 4 * 3, 16, key=k[2]), eqx.nn.Linear(16, 3, key=k[3])]

    def __call__(self, x):
        x = jax.nn.relu(self.layers[0](x))
        x = jax.nn.relu(self.layers[1](x))
        return self.layers[3](jax.nn.relu(self.layers[2](x.reshape(-1))))
