"""CLIP and SigLIP as a benchmark subject (`zoo.bench.spec`): the FLOPs of their matrix
products (the floor of the benchmark's FLOP check), the image tower's as the ViT's and the
text tower's as the decoder-only families' (`decoder_flops`, less the vocabulary head it has
not), with the projections; forward and training steps of image-text pairs."""

from typing import Any

from zoo.bench.archs.vit import useful_flops as vit_flops
from zoo.bench.spec import BenchSpec, PresetFields, decoder_flops, register
from zoo.models.clip.config import NAMED_MODELS


def clip_flops(config: Any, batch: int, mode: str) -> float:
    """The two towers' products, the text one's without a vocabulary head, and the image
    and text projections (`2 * width * projection_dim` each per pair; three times that in
    training)."""
    steps = 1 if mode == "forward" else 3
    head = 2 * config.length * config.text_hidden_size * config.vocab_size * batch
    projections = 2 * config.projection_dim * (
        config.text_hidden_size + config.vision_hidden_size * config.family.projections)
    return (vit_flops(config.vision, batch, mode) + decoder_flops(config, batch, mode)
            - steps * head + steps * batch * projections)


PRESETS: tuple[PresetFields, ...] = (
    {"name": "clip-b16", "batch": 8,
     "config": {**NAMED_MODELS["clip-vit-base-patch16"], "seq_len": 16},
     "doc": "openai/clip-vit-base-patch16's shape: 224x224 images, 16 text tokens"},
)

register(BenchSpec("clip", default_batch=8, useful_flops=clip_flops, presets=PRESETS))
