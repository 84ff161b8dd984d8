"""The checkpoint formats the zoo reads and writes, one class each, registered in the order
``--to`` lists them (detection order: see `converters.checkpoints.format.registered`).

A new format is a `CheckpointFormat` subclass in a module here and one line below.
"""

from converters.checkpoints.format import register
from converters.checkpoints.formats.equinox import EquinoxLeaves
from converters.checkpoints.formats.hub_folder import HubFolder, HubShards
from converters.checkpoints.formats.msgpack import FlaxMsgpack
from converters.checkpoints.formats.native import NativeFormat
from converters.checkpoints.formats.npz import Npz
from converters.checkpoints.formats.orbax import LinenOrbax, NnxOrbax
from converters.checkpoints.formats.safetensors import CanonicalSafetensors, TorchSafetensors
from converters.checkpoints.formats.safetensors_shards import (
    CanonicalShardIndex,
    CanonicalShards,
    TorchShardIndex,
    TorchShards,
)
from converters.checkpoints.formats.torch_pickle import TorchPickle

for _fmt in (EquinoxLeaves(), LinenOrbax(), NnxOrbax(), CanonicalSafetensors(), TorchPickle(),
             TorchSafetensors(), CanonicalShards(), CanonicalShardIndex(), TorchShards(),
             TorchShardIndex(), Npz(), FlaxMsgpack(), HubFolder(), HubShards()):
    register(_fmt)

__all__ = ["CanonicalSafetensors", "CanonicalShardIndex", "CanonicalShards", "EquinoxLeaves",
           "FlaxMsgpack", "HubFolder", "HubShards", "LinenOrbax", "NativeFormat", "NnxOrbax", "Npz",
           "TorchPickle", "TorchSafetensors", "TorchShardIndex", "TorchShards"]
