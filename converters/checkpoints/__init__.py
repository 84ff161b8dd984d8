"""Checkpoint files of Equinox, Flax Linen, Flax NNX and PyTorch, converted through the canonical
layout (PyTorch ``state_dict`` names and layouts). See docs/checkpoints.md.

    ckpt = converters.load("run/model.eqx")                 # a Checkpoint (canonical arrays)
    model = converters.load("run/model.eqx", "nnx")         # a native NNX model
    converters.save(model, "model.safetensors", "canonical")
    converters.convert_file("model.pt", "model_nnx", to="nnx", config=cfg)

Formats (each the library's own way of saving):

- ``eqx``: an ``eqx.tree_serialise_leaves`` file plus a JSON sidecar ``<file>.json``;
- ``linen``: an orbax-checkpoint directory of the variables (plus ``zoo.json`` inside);
- ``nnx``: an orbax-checkpoint directory of ``nnx.state(model)`` (plus ``zoo.json`` inside);
- ``canonical``: safetensors, PyTorch names and layouts, metadata with architecture and config;
- ``torch``: a ``state_dict`` as ``.pt`` (read only with ``weights_only=True``) or ``.safetensors``;
- ``torch`` / ``canonical`` sharded: a folder of safetensors shards and HF's
  ``model.safetensors.index.json`` (read from the folder or the index; ``shard_size=`` writes it);
- ``npz``: ``np.savez`` of the canonical arrays (read with ``allow_pickle=False``), a sidecar;
- ``msgpack``: ``flax.serialization.to_bytes`` of Linen variables, a sidecar;
- ``hub``: a ``config.json`` a `HubReader` knows (HF transformers' ViT, timm) beside the
  weights; written for a family with one architecture (HF ViT).

Safetensors and ``.pt`` sources are memory-mapped, safetensors targets written tensor by tensor:
a conversion holds at most one copy of the checkpoint (see docs/checkpoint_details.md).

Wrapped and training checkpoints give their model weights (`converters.checkpoints.unwrap`):
``weights="main" | "ema"`` chooses live or EMA weights, `Checkpoint.notes` says what was left out.

Each format is one class (`converters.checkpoints.format.CheckpointFormat`: detect, read,
write, entries) registered in `converters.checkpoints.formats`; detection, `read`, `write`,
`inspect_checkpoint` and the command line all consult that registry.

Nothing read is ever executed: no pickle except PyTorch's ``weights_only`` loader (with a few
inert globals allowed for that call), ``.npy`` records with ``allow_pickle=False``, msgpack,
JSON for metadata. Output is atomic: written next to the
destination under a temporary name and renamed at the end.
"""

from converters.adapters.config_readers import HubReader
from converters.adapters.config_readers import register as register_hub_reader
from converters.checkpoints.api import (
    as_checkpoint,
    convert_file,
    detect_impl,
    load,
    load_canonical,
    save,
    save_canonical,
)
from converters.checkpoints.checkpoint import FORMAT_VERSION, Checkpoint, Detection
from converters.checkpoints.configs import parse_config
from converters.checkpoints.detect import detect
from converters.checkpoints.format import (
    CheckpointFormat,
    ForeignTree,
    format_names,
    register,
    registered,
)
from converters.checkpoints.inspect import Report, disk_size, inspect_checkpoint
from converters.checkpoints.io import CheckpointError, ProgressFn
from converters.checkpoints.readwrite import DestinationWarning, read, write

# the built-in formats that hold any checkpoint (not `hub`); `format_names()` is live
FORMATS: tuple[str, ...] = format_names(holding_any=True)

__all__ = [
    "FORMATS", "FORMAT_VERSION", "Checkpoint", "CheckpointError", "CheckpointFormat",
    "DestinationWarning", "Detection", "ForeignTree", "HubReader", "ProgressFn", "Report",
    "as_checkpoint", "convert_file",
    "detect", "detect_impl", "disk_size", "format_names", "inspect_checkpoint", "load",
    "load_canonical", "parse_config", "read", "register", "register_hub_reader", "registered",
    "save",
    "save_canonical", "write",
]
