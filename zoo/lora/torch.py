"""LoRA in the zoo's PyTorch modules, as peft builds it: each targeted layer replaced, on a
copy, by a module holding it as `base_layer` beside `lora_A` and `lora_B` (`nn.Linear`s
without bias, weights `(rank, in)` and `(out, rank)`). On transformers' own models use peft
itself (`peft.get_peft_model`); `zoo.lora.save` / `load` exchange adapters with it."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn


class LoRALinear(nn.Module):
    """`base_layer(x) + scale * lora_B(lora_A(x))`."""

    def __init__(self, base_layer: nn.Module, a: Any, b: Any, spec: Any) -> None:
        super().__init__()
        self.base_layer, self.spec = base_layer, spec
        weight = next(base_layer.parameters())
        self.lora_A = nn.Linear(a.shape[1], a.shape[0], bias=False)
        self.lora_B = nn.Linear(b.shape[1], b.shape[0], bias=False)
        with torch.no_grad():
            for layer, f in ((self.lora_A, a), (self.lora_B, b)):
                layer.weight.copy_(torch.from_numpy(np.array(f, np.float32)))
        self.to(weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.spec.scale * self.lora_B(self.lora_A(x))


def wrap(model: Any, targets: list, factors: dict, spec: Any) -> Any:
    model = copy.deepcopy(model)
    for t in targets:
        old = model.get_submodule(t.name)
        model.set_submodule(t.name, LoRALinear(old, *factors[t.name], spec))
    return model


def _adapted(model: Any) -> list[tuple[str, LoRALinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]


def unwrap(model: Any) -> Any:
    model = copy.deepcopy(model)
    for name, m in _adapted(model):
        model.set_submodule(name, m.base_layer)
    return model


def factors(model: Any) -> dict:
    return {name: (m.lora_A.weight.detach().numpy(), m.lora_B.weight.detach().numpy())
            for name, m in _adapted(model)}


def spec(model: Any) -> Any:
    found = _adapted(model)
    return found[0][1].spec if found else None
