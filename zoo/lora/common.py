"""What the JAX libraries' LoRA modules share: reading the factors back by leaf name."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from zoo.libraries import interface


def factors(model: Any, impl: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`{layer: (A, B)}` of a LoRA model, canonical layout (`(rank, in)`, `(out, rank)`): its
    `<layer>.lora_A.<array>` leaves by name (`Interface.leaf_names`), a Flax `kernel`
    `(in, out)` transposed to the `weight` `(out, in)` as every linear layer's."""
    api = interface(impl)
    static, params, _ = api.split(model)
    found: dict[str, dict[str, np.ndarray]] = {}
    for name, a in zip(api.leaf_names(static, params), jax.tree.leaves(params), strict=True):
        layer, sep, rest = name.partition(".lora_")
        if sep:
            which, _, array = rest.partition(".")
            found.setdefault(layer, {})[which] = np.asarray(a.T if array == "kernel" else a)
    return {layer: (f["A"], f["B"]) for layer, f in found.items()}
