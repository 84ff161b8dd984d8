"""One object per library: everything the project knows about Equinox, Linen, NNX and PyTorch.

A `Library` (`zoo.libraries.library`) builds models (`native_init`, `skeleton`), recognises its
objects (`owns`), states its layout facts (`channels_last`, the parameter layout `family`),
gives its canonical `walker`, its functional `interface`, its model contract (`check_class`)
and its native checkpoint format (how a benchmark calls and draws it is that benchmark's to
know). Call sites ask `library(name)`;
the built-in four are registered here, a new one with `register_library` (see
docs/adding_a_library.md).
"""

from __future__ import annotations

from zoo.libraries.eqx import EQX
from zoo.libraries.library import (
    IMPLS,
    JAX_IMPLS,
    LIBRARIES,
    ContractError,
    Library,
    interface,
    jax_libraries,
    library,
    native_interface,
    owner,
    register_library,
    registered,
)
from zoo.libraries.linen import LINEN
from zoo.libraries.nnx import NNX
from zoo.libraries.torch import TORCH

for _lib in (EQX, LINEN, NNX, TORCH):
    register_library(_lib)

__all__ = [
    "EQX", "IMPLS", "JAX_IMPLS", "LIBRARIES", "LINEN", "NNX", "TORCH", "ContractError",
    "Library", "interface", "jax_libraries", "library", "native_interface", "owner",
    "register_library", "registered",
]
