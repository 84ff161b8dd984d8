"""Converters between Equinox, Flax Linen, Flax NNX and PyTorch parameters.

Everything goes through one neutral layout, the canonical state: PyTorch's ``state_dict`` names
and layouts as a flat ``{name: array}`` dict.

    state = converters.to_canonical(model, "nnx")
    module, variables = converters.from_canonical(state, "cnn", "linen")
    model, eqx_state = converters.convert(nnx_model, "nnx", "eqx")
"""

from canonical import KINDS, Layer, LayerKind, register_class, register_kind
from converters.core import (
    ConversionError,
    as_numpy_state,
    canonical_layers,
    canonical_spec,
    config_of,
    convert,
    from_canonical,
    to_canonical,
    validate,
)

__all__ = [
    "KINDS", "ConversionError", "Layer", "LayerKind", "as_numpy_state", "canonical_layers",
    "canonical_spec", "config_of", "convert", "from_canonical", "register_class",
    "register_kind", "to_canonical", "validate",
]

# Checkpoint files: formats eqx / linen / nnx / canonical / torch, `python -m converters`.
# Bring your own checkpoint: layer matching for models and trees the zoo did not build.
from converters import matching
from converters.adapters.config_readers import config_json
from converters.checkpoints import (
    FORMATS,
    Checkpoint,
    CheckpointError,
    DestinationWarning,
    convert_file,
    detect,
    inspect_checkpoint,
    load,
    load_canonical,
    read,
    save,
    save_canonical,
    write,
)
from converters.checkpoints.readwrite import read_state
from converters.checkpoints.sources import source_config
from converters.matching import MatchError, import_state, transfer
from converters.optim import CanonicalOptState
from zoo.weights.loading import register_reader

# zoo.create(..., weights=PATH) reads files with the formats here, and a source named as a model
# (zoo.create("hf-hub:ORG/REPO", ...)) gives its config through the hub readers.
register_reader(read_state, source_config, config_json)

__all__ += [
    "FORMATS", "CanonicalOptState", "Checkpoint", "CheckpointError", "DestinationWarning",
    "MatchError",
    "convert_file", "detect", "import_state", "inspect_checkpoint", "load", "load_canonical",
    "matching", "read", "save", "save_canonical", "transfer", "write",
]

