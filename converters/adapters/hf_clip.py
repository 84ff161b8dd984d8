"""HF transformers CLIP and SigLIP image towers (`CLIPVisionModel`, `SiglipVisionModel`, and
the image towers of `CLIPModel` / `SiglipModel` checkpoints): their key layouts (one for files
and transformers 5's modules alike) and `config.json` (`model_type` `clip_vision_model`,
`siglip_vision_model`; the two-tower `clip` / `siglip` folders are `hf_clip_model`'s, whose
layouts reuse these under `vision_model.`).

The zoo's ViT is the same function:
- CLIP: timm's CLIP options (`pre_norm`: HF's `pre_layrnorm` is `norm_pre`, the patch
  embedding without bias), the class embedding `(E,)` and the position embedding table
  `(N, E)` reshaped to `cls_token (1, 1, E)` / `pos_embed (1, N, E)`, q, k, v fused, the
  activation of `hidden_act` (`quick_gelu` for OpenAI's weights); no head: the output is HF's
  `pooler_output` (the class token after `post_layernorm`, the zoo's `norm`).
- SigLIP: no class token, the attention-pool head (`global_pool="map"`: HF's `head.probe` is
  `attn_pool.latent`, its `nn.MultiheadAttention` packed `in_proj` splits into the zoo's `q`
  and `kv`), the tanh GELU (`gelu_pytorch_tanh`); the output is HF's `pooler_output`.
Of a two-tower state dict read as a ViT the text tower, the projections into the joint
embedding and the logit scale are left out (the zoo's output is the image tower's pooled
features, before `visual_projection`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.adapter import LEADING, Adapter, Drop, Fuse, Rename, Split, reshape
from converters.adapters.config_readers import HubReader
from converters.adapters.hf_common import activation, fields, pair
from zoo.configs import Config, ConfigError
from zoo.models.vit.config import ViTConfig

_V = "vision_model."
_BLOCK = _V + "encoder.layers.{i}"
_BLOCKS = (
    *(Rename(f"{_BLOCK}.{hf}.{{p}}", f"blocks.{{i}}.{zoo}.{{p}}") for hf, zoo in {
        "layer_norm1": "norm1", "self_attn.out_proj": "attn.proj", "layer_norm2": "norm2",
        "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}.items()),)
_QKV = (Fuse(tuple(f"{_BLOCK}.self_attn.{n}_proj.{{p}}" for n in "qkv"),
             "blocks.{i}.attn.qkv.{p}", "query, key and value"),)
_POSITIONS = Rename(_V + "embeddings.position_embedding.weight", "pos_embed", LEADING)
_TEXT = (Drop("text_model.{r}", "the text tower"),
         Drop("logit_scale", "the logit scale of the text-image similarity"),
         Drop(_V + "embeddings.position_ids", "position ids (a buffer derived from the size)"))
_GROUPS = (("embeddings.patch_embedding", "patch embedding (embeddings.patch_embedding)"),
           ("embeddings.position_embedding",
            "position embeddings (embeddings.position_embedding)"))

HF_CLIP_VISION = Adapter(
    name="hf-clip-vision", description="HF transformers CLIP image tower", arch="vit",
    prefix=_V, groups=(*_GROUPS, ("embeddings.class_embedding",
                                  "class embedding (embeddings.class_embedding)")),
    renames=(Rename(_V + "embeddings.class_embedding", "cls_token", reshape((1, 1, -1), (-1,))),
             Rename(_V + "embeddings.patch_embedding.weight", "patch_embed.proj.weight"),
             _POSITIONS, Rename(_V + "pre_layrnorm.{p}", "norm_pre.{p}"), *_BLOCKS,
             Rename(_V + "post_layernorm.{p}", "norm.{p}")),
    fuses=_QKV,
    drops=(*_TEXT, Drop("text_projection.weight", "the text projection"),
           Drop("visual_projection.weight", "the image projection into the joint embedding "
                "(the zoo's output is the pooled features before it, CLIPVisionModel's)")))

_HEAD = _V + "head."
HF_SIGLIP_VISION = Adapter(
    name="hf-siglip-vision", description="HF transformers SigLIP image tower", arch="vit",
    prefix=_V, groups=(*_GROUPS, ("head.probe", "attention-pool head (head.probe)")),
    renames=(Rename(_V + "embeddings.patch_embedding.{p}", "patch_embed.proj.{p}"),
             _POSITIONS, *_BLOCKS, Rename(_V + "post_layernorm.{p}", "norm.{p}"),
             Rename(_HEAD + "probe", "attn_pool.latent"),
             Rename(_HEAD + "attention.out_proj.{p}", "attn_pool.proj.{p}"),
             Rename(_HEAD + "layernorm.{p}", "attn_pool.norm.{p}"),
             Rename(_HEAD + "mlp.fc1.{p}", "attn_pool.mlp.fc1.{p}"),
             Rename(_HEAD + "mlp.fc2.{p}", "attn_pool.mlp.fc2.{p}")),
    fuses=_QKV,
    splits=(Split(_HEAD + "attention.in_proj_weight",
                  ("attn_pool.q.weight", "attn_pool.kv.weight"), (1, 2)),
            Split(_HEAD + "attention.in_proj_bias", ("attn_pool.q.bias", "attn_pool.kv.bias"),
                  (1, 2))),
    drops=(*_TEXT, Drop("logit_bias", "the logit bias of the text-image similarity")))

_CLIP = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
         "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 32,
         "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5}
_SIGLIP = {**_CLIP, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh",
           "layer_norm_eps": 1e-6, "vision_use_head": True}


def _tower(raw: Mapping[str, Any], where: str, family: str, defaults: dict[str, Any],
           **options: Any) -> ViTConfig:
    """The zoo's ViT of an image tower's `config.json` (or a two-tower one's
    `vision_config`)."""
    if "vision_config" in raw:
        raw = raw["vision_config"] or {}
        where = f"{where} (vision_config)"
    got = fields(raw, where, family, defaults)
    if not got.get("vision_use_head", True):
        raise ConfigError(f"{where}: vision_use_head false: a SigLIP tower without its "
                          "attention-pool head has no pooled output the zoo's ViT gives")
    width = got["hidden_size"]
    try:
        return ViTConfig(
            image_size=pair(got["image_size"]), patch_size=got["patch_size"],
            in_channels=got["num_channels"], width=width, depth=got["num_hidden_layers"],
            num_heads=got["num_attention_heads"], mlp_ratio=got["intermediate_size"] / width,
            norm_eps=got["layer_norm_eps"],
            act_layer=activation(got["hidden_act"], where, family), num_classes=0, **options)
    except (TypeError, ZeroDivisionError, ConfigError) as e:
        raise ConfigError(f"{where}: invalid {family} config: {e}") from e


class HFCLIPVisionReader(HubReader):
    """`config.json` of a CLIP image tower (`clip_vision_model`); read only (two-tower CLIP
    folders: `hf_clip_model`)."""

    name: ClassVar[str] = "hf-clip-vision"
    adapter: ClassVar[Adapter | None] = HF_CLIP_VISION

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return raw.get("model_type") == "clip_vision_model"

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        return _tower(raw, where, "HF CLIP image tower", _CLIP, pre_norm=True)


class HFSiglipVisionReader(HubReader):
    """`config.json` of a SigLIP image tower (`siglip_vision_model`); read only (two-tower
    SigLIP folders: `hf_clip_model`)."""

    name: ClassVar[str] = "hf-siglip-vision"
    adapter: ClassVar[Adapter | None] = HF_SIGLIP_VISION

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return raw.get("model_type") == "siglip_vision_model"

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        return _tower(raw, where, "HF SigLIP image tower", _SIGLIP, class_token=False,
                      global_pool="map")
