"""PyTorch: the reference; `nn.Module` objects whose `state_dict` is the canonical layout.

torch itself is imported only when a model is built (the zoo works without it installed).
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp

from canonical.walkers import TorchWalker
from zoo.configs import Config
from zoo.interface import TorchInterface
from zoo.libraries.library import Library


class TorchModel(Protocol):
    """A PyTorch model class: `cls(config)`, an `nn.Module` keeping `self.config`, built on the
    global RNG (seeded from the key) and cast to the dtype afterwards."""

    config: Config

    def __init__(self, config: Config) -> None: ...


class TorchLibrary(Library):
    name = "torch"
    is_jax = False
    reference = True
    package = "torch"
    install = "pip install 'jax-model-zoo[torch]'"
    checkpoint_format = "torch"
    walker = TorchWalker()
    interface = TorchInterface()
    lora = "zoo.lora.torch"
    contract = TorchModel

    def owns(self, obj: Any) -> bool:
        return any(c.__module__.startswith("torch.nn") for c in type(obj).__mro__)

    def set_threads(self, n: int) -> None:
        import torch

        torch.set_num_threads(n)

    def native_init(self, cls: type, config: Config, key: jax.Array, dtype: Any) -> Any:
        import torch

        torch.manual_seed(int(jax.random.randint(key, (), 0, 2**31 - 1)))
        return cls(config).to(getattr(torch, jnp.dtype(dtype).name))


TORCH = TorchLibrary()
