"""CLIP's and SigLIP's two-tower configuration: transformers' `CLIPConfig` / `SiglipConfig`
(their `text_config` and `vision_config` as flat fields, `text_*` and `vision_*`), the text
tower a `DecoderSpec` of the shared body, the image tower the zoo's ViT. `model_type` chooses
the family (`FAMILIES`): CLIP's causal text tower pooled at the EOS token and its two
projections without bias, or SigLIP's bidirectional one pooled at the last token through its
`head`, and its logit bias."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from zoo.configs import Config, ConfigError, positive
from zoo.models.decoder import AttentionSpec, DecoderSpec, MLPSpec, Names, PoolSpec

if TYPE_CHECKING:  # imported where used: the registry keeps the folders' order
    from zoo.models.vit.config import ViTConfig

_BLOCK = (("self_attn", "attention"), ("layer_norm1", "attention_norm"), ("mlp", "mlp"),
          ("layer_norm2", "mlp_norm"))
# transformers' activation names -> the ViT's `act_layer`
_VIT_ACTS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}
Activation = Literal["quick_gelu", "gelu", "gelu_pytorch_tanh"]


@dataclass(frozen=True)
class Family:
    """What one `model_type` computes: the text tower's mask (`causal`) and pooled token
    (`pool`: "eos", CLIP's, or "last"), SigLIP's text `head` (a Linear with bias after the
    pooled token), CLIP's `visual_projection` / `text_projection` (Linears without bias),
    the logit scale's shape and a logit bias, the probabilities of zero-shot labels
    (`softmax` over the labels, CLIP's; `sigmoid` of each, SigLIP's), the image tower's
    ViT options, and how its processor prepares texts: padded to the longest with the
    attention mask (CLIP), or to `max_position_embeddings` without it (SigLIP)."""

    causal: bool
    pool: Literal["eos", "last"]
    text_head: bool
    projections: bool
    scale_shape: tuple[int, ...]
    logit_bias: bool
    probabilities: Literal["softmax", "sigmoid"]
    vision: tuple[tuple[str, Any], ...]
    text_padding: Literal["longest", "max_length"]  # how its texts are padded (processor's)
    text_mask: bool  # whether its text tower is given the attention mask


FAMILIES: dict[str, Family] = {
    "clip": Family(True, "eos", False, True, (), False, "softmax",
                   (("pre_norm", True),), "longest", True),
    "siglip": Family(False, "last", True, False, (1,), True, "sigmoid",
                     (("class_token", False), ("global_pool", "map")), "max_length", False),
}
_SIGLIP = {"model_type": "siglip", "vocab_size": 32000, "text_hidden_size": 768,
           "text_intermediate_size": 3072, "text_num_attention_heads": 12,
           "text_hidden_act": "gelu_pytorch_tanh", "text_layer_norm_eps": 1e-6,
           "max_position_embeddings": 64, "projection_dim": 768,
           "logit_scale_init_value": math.log(10.0), "logit_bias_init_value": -10.0,
           "patch_size": 16, "vision_hidden_act": "gelu_pytorch_tanh",
           "vision_layer_norm_eps": 1e-6}
# The published config.json files (tests/fixtures/hf_configs/ holds them; each named model is
# pinned there to transformers' keys, shapes and parameter count).
NAMED_MODELS: dict[str, dict[str, Any]] = {
    "clip-vit-base-patch16": {"patch_size": 16, "eos_token_id": 2},
    "siglip-base-patch16-224": _SIGLIP,
}
# The releases on the Hub, with their processors' preprocessing as timm's fields: CLIP's
# shortest side to 224 (bicubic) and a centre crop, OpenAI's mean and std; SigLIP's resize to
# 224x224 (bicubic), mean and std 0.5.
_IMAGES = {"input_size": [3, 224, 224], "interpolation": "bicubic"}
HUB_REPOS: dict[str, dict[str, Any]] = {
    "clip-vit-base-patch16": {"openai": {
        "hub": "openai/clip-vit-base-patch16", "license": "mit", **_IMAGES, "crop_pct": 1.0,
        "crop_mode": "center", "mean": [0.48145466, 0.4578275, 0.40821073],
        "std": [0.26862954, 0.26130258, 0.27577711]}},
    "siglip-base-patch16-224": {"google": {
        "hub": "google/siglip-base-patch16-224", "license": "apache-2.0", **_IMAGES,
        "crop_pct": 1.0, "crop_mode": "squash", "mean": [0.5, 0.5, 0.5],
        "std": [0.5, 0.5, 0.5]}},
}


@dataclass(frozen=True)
class ClipConfig(Config):
    """transformers' CLIP (and, `model_type` "siglip", SigLIP) as two towers: the text
    transformer (token and learned position embeddings, pre-LayerNorm blocks of
    `self_attn` `q/k/v/out_proj` and `mlp` `fc1`/`fc2`, `final_layer_norm`, pooled) and the
    zoo's ViT (CLIP's or SigLIP's options, no classifier), each projected into the joint
    space (`projection_dim`), normalised, their dot product times `exp(logit_scale)` (plus
    SigLIP's `logit_bias`). The defaults are `CLIPConfig`'s (openai/clip-vit-base-patch32).

    The uniform call takes images `(N, C, H, W)` and the keyword `input_ids` `(N, L)` (and
    `attention_mask`) and gives each image-text pair's logit `(N, 1)`: the diagonal of
    `logits_per_image`. Without `input_ids` the text is `placeholder_ids` (so that a call
    with images alone, as the interfaces' `init` makes, builds both towers).
    `get_image_features`, `get_text_features` and `logits` are transformers' methods.
    CLIP pools at the first `eos_token_id`, or at the highest id when it is 2 (transformers'
    rule for the configs written before it took the EOS id)."""

    arch: ClassVar[str] = "clip"
    REFERENCES: ClassVar[dict[str, str]] = {
        "transformers' CLIPModel and SiglipModel (features, logits, folders)":
            "tests/test_clip.py",
        "the published config.json files, parameter counts": "tests/test_clip.py",
    }
    TINY: ClassVar[dict[str, Any]] = {
        "vocab_size": 64, "text_hidden_size": 16, "text_intermediate_size": 32,
        "text_num_hidden_layers": 2, "text_num_attention_heads": 2,
        "max_position_embeddings": 8, "eos_token_id": 63, "projection_dim": 12,
        "image_size": (8, 8), "patch_size": 4, "vision_hidden_size": 16,
        "vision_intermediate_size": 32, "vision_num_hidden_layers": 2,
        "vision_num_attention_heads": 2}
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {
        "siglip": {"model_type": "siglip", "projection_dim": 16,
                   "logit_scale_init_value": math.log(10.0), "logit_bias_init_value": -10.0,
                   "text_hidden_act": "gelu_pytorch_tanh",
                   "vision_hidden_act": "gelu_pytorch_tanh"}}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = NAMED_MODELS
    HUB_REPOS: ClassVar[dict[str, dict[str, Any]]] = HUB_REPOS
    LOSS: ClassVar[str] = "mse"
    model_type: Literal["clip", "siglip"] = "clip"
    projection_dim: int = 512
    logit_scale_init_value: float = 2.6592
    logit_bias_init_value: float = 0.0
    vocab_size: int = 49408
    text_hidden_size: int = 512
    text_intermediate_size: int = 2048
    text_num_hidden_layers: int = 12
    text_num_attention_heads: int = 8
    text_hidden_act: Activation = "quick_gelu"
    text_layer_norm_eps: float = 1e-5
    max_position_embeddings: int = 77
    eos_token_id: int = 49407
    image_size: tuple[int, int] = (224, 224)
    patch_size: int = 32
    num_channels: int = 3
    vision_hidden_size: int = 768
    vision_intermediate_size: int = 3072
    vision_num_hidden_layers: int = 12
    vision_num_attention_heads: int = 12
    vision_hidden_act: Activation = "quick_gelu"
    vision_layer_norm_eps: float = 1e-5
    seq_len: int | None = None  # the placeholder text's length (None: every position)

    def validate(self) -> None:
        positive("clip sizes", (self.projection_dim, self.vocab_size, self.text_hidden_size,
                                self.text_intermediate_size, self.text_num_hidden_layers,
                                self.text_num_attention_heads, self.max_position_embeddings))
        if self.text_hidden_size % self.text_num_attention_heads:
            raise ConfigError(f"clip.text_hidden_size {self.text_hidden_size} must be a "
                              f"multiple of text_num_attention_heads "
                              f"{self.text_num_attention_heads}")
        if not self.family.projections and self.projection_dim != self.vision_hidden_size:
            raise ConfigError(f"clip: a {self.model_type} text head's projection_dim "
                              f"{self.projection_dim} must equal vision_hidden_size "
                              f"{self.vision_hidden_size} (its image features are unprojected)")
        if self.seq_len is not None and not 0 < self.seq_len <= self.max_position_embeddings:
            raise ConfigError(f"clip.seq_len {self.seq_len} must be in 1 .. "
                              f"max_position_embeddings {self.max_position_embeddings}")
        self.vision  # noqa: B018 (the image tower's own checks)

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    @property
    def vision(self) -> ViTConfig:
        """The image tower: the zoo's ViT, pooled, without classifier."""
        from zoo.models.vit.config import ViTConfig

        width = self.vision_hidden_size
        return ViTConfig(
            image_size=self.image_size, patch_size=self.patch_size,
            in_channels=self.num_channels, width=width, depth=self.vision_num_hidden_layers,
            num_heads=self.vision_num_attention_heads,
            mlp_ratio=self.vision_intermediate_size / width,
            norm_eps=self.vision_layer_norm_eps, act_layer=_VIT_ACTS[self.vision_hidden_act],
            num_classes=0, **dict(self.family.vision))

    @property
    def pooling(self) -> PoolSpec:
        """The text tower's pooled token: SigLIP's last; CLIP's first EOS, or the highest id
        for `eos_token_id` 2 (transformers' rule), then SigLIP's head."""
        f = self.family
        if f.pool == "last":
            return PoolSpec("last", size=self.projection_dim, tanh=False)
        if self.eos_token_id == 2:
            return PoolSpec("max_id", tanh=False)
        return PoolSpec("eos", eos_token_id=self.eos_token_id, tanh=False)

    @property
    def decoder(self) -> DecoderSpec:
        """The text tower on the shared body: learned positions, pre-LayerNorm blocks,
        attention causal (CLIP) or both ways (SigLIP), `final_layer_norm`, pooled."""
        f, e, heads = self.family, self.text_hidden_size, self.text_num_attention_heads
        names = Names(body="text_model", embedding="embeddings.token_embedding",
                      layers="encoder.layers", norm="final_layer_norm", block=_BLOCK,
                      positions="embeddings.position_embedding",
                      pooler="head" if f.text_head else None)
        return DecoderSpec(
            names, self.vocab_size, e, self.text_num_hidden_layers, "layer_norm",
            self.text_layer_norm_eps,
            AttentionSpec("out_proj", heads, heads, e // heads, qkv_bias=True, out_bias=True,
                          causal=f.causal),
            MLPSpec("fc", self.text_intermediate_size, self.text_hidden_act, bias=True),
            max_positions=self.max_position_embeddings, pooling=self.pooling)

    @property
    def length(self) -> int:
        """The placeholder text's length (`seq_len`, else every position)."""
        return self.seq_len or self.max_position_embeddings

    def placeholder_ids(self) -> np.ndarray:
        """The text of a call without `input_ids`: ids `1 .. L-1` (wrapped in the vocabulary),
        then `eos_token_id` (the last id where it is not one), `(length,)` int32."""
        ids = np.arange(1, self.length + 1) % self.vocab_size
        ids[-1] = min(self.eos_token_id, self.vocab_size - 1)
        return ids.astype(np.int32)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.num_channels, *self.image_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (1,)
