"""The canonical layout and the mechanisms both `zoo` and `converters` build on.

The canonical state of a model is a flat ``{name: array}`` dict with PyTorch ``state_dict`` names
and layouts (``fc1.weight``, ``blocks.0.norm1.bias``, ``bns.0.running_var``). This package knows how
to find the layers of a native model in each library (`walkers`), what each kind of layer holds
and how its arrays map to the canonical layout (`kinds`), and nothing about architectures: it
imports neither `zoo` nor `converters`.

    state = canonical.read(model, "nnx")                 # every array, or a ConversionError
    model = canonical.write(skeleton, state, "linen")    # a new model holding `state`
"""

from canonical import attention, rules  # the built-in layer kinds
from canonical.errors import ConversionError, KeyMismatchError, StateMismatchError
from canonical.kinds import (
    KINDS,
    Layer,
    LayerKind,
    kind_of,
    register_class,
    register_kind,
    unregister_kind,
)
from canonical.paths import path_name
from canonical.state import layers, read, spec, walker, write
from canonical.ties import Tie, tie, untie
from canonical.walkers import WALKERS, Walker

__all__ = [
    "KINDS", "WALKERS", "ConversionError", "KeyMismatchError", "Layer", "LayerKind",
    "StateMismatchError", "Tie", "Walker",
    "attention", "kind_of",
    "layers",
    "path_name", "read", "register_class", "register_kind", "rules", "spec", "tie",
    "unregister_kind", "untie", "walker", "write",
]
