"""HF transformers DINOv2 (`Dinov2Model`, `model_type: dinov2`): its files' key layout
(`encoder.layer.N.attention.attention.query`, `layer_scale1.lambda1`, SwiGLU's
`mlp.weights_in` / `weights_out`), the module names of transformers 5's `state_dict()`
(`attention.q_proj`, SwiGLU's `mlp.gate_proj` / `up_proj` / `down_proj`), and `config.json`.

The zoo's ViT with timm's DINOv2 options is the same function: q, k, v are fused into `qkv`,
`layer_scale{1,2}.lambda1` are LayerScale's `ls{1,2}.gamma`, SwiGLU's packed `weights_in`
(gate rows, then up rows) is `mlp.fc1` of `mlp_layer="swiglu_packed"`, the final
`layernorm` is `norm`; the model has no head (`num_classes=0`: its output is the class token's
features, HF's `pooler_output`). HF interpolates the position embedding at every input size
but its own (bicubic, without antialiasing): the config takes `dynamic_img_size` (timm's
resampling, with antialiasing), equal at the checkpoint's size. The mask token (masked-image
pre-training) is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.adapter import Adapter, Drop, Fuse, Rename
from converters.adapters.config_readers import HubReader
from converters.adapters.hf_common import activation, classes, fields, pair
from zoo.configs import Config, ConfigError
from zoo.models.vit.config import ViTConfig

_EMBEDDINGS = (Rename("embeddings.cls_token", "cls_token"),
               Rename("embeddings.position_embeddings", "pos_embed"),
               Rename("embeddings.patch_embeddings.projection.{p}", "patch_embed.proj.{p}"),
               Rename("layernorm.{p}", "norm.{p}"))
_GROUPS = (("embeddings.cls_token", "class token (embeddings.cls_token)"),
           ("embeddings.position_embeddings",
            "position embeddings (embeddings.position_embeddings)"),
           ("embeddings.patch_embeddings", "patch embedding (embeddings.patch_embeddings)"))
_DROPS = (Drop("embeddings.mask_token", "DINOv2's mask token (masked-image pre-training only)"),)
_BLOCK = "encoder.layer.{i}"
_COMMON = {"norm1": "norm1", "norm2": "norm2", "layer_scale1.lambda1": "ls1.gamma",
           "layer_scale2.lambda1": "ls2.gamma", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}


def _renames(names: dict[str, str]) -> tuple[Rename, ...]:
    return tuple(Rename(f"{_BLOCK}.{hf}" + ("" if hf.endswith("lambda1") else ".{p}"),
                        f"blocks.{{i}}.{zoo}" + ("" if hf.endswith("lambda1") else ".{p}"))
                 for hf, zoo in names.items())


def _qkv(names: tuple[str, str, str]) -> Fuse:
    return Fuse(tuple(f"{_BLOCK}.{n}.{{p}}" for n in names), "blocks.{i}.attn.qkv.{p}",
                "query, key and value")


HF_DINOV2 = Adapter(
    name="hf-dinov2", description="HF transformers DINOv2", arch="vit", groups=_GROUPS,
    renames=(*_EMBEDDINGS, *_renames({**_COMMON, "attention.output.dense": "attn.proj",
                                      "mlp.weights_in": "mlp.fc1",
                                      "mlp.weights_out": "mlp.fc2"})),
    fuses=(_qkv(("attention.attention.query", "attention.attention.key",
                 "attention.attention.value")),),
    drops=_DROPS)
HF_DINOV2_MODULES = Adapter(
    name="hf-dinov2-modules", description="HF transformers DINOv2 (transformers 5 module names)",
    arch="vit", groups=_GROUPS,
    renames=(*_EMBEDDINGS, *_renames({**_COMMON, "attention.o_proj": "attn.proj",
                                      "mlp.down_proj": "mlp.fc2"})),
    fuses=(_qkv(("attention.q_proj", "attention.k_proj", "attention.v_proj")),
           Fuse((f"{_BLOCK}.mlp.gate_proj.{{p}}", f"{_BLOCK}.mlp.up_proj.{{p}}"),
                "blocks.{i}.mlp.fc1.{p}", "SwiGLU's gate and up projections")),
    drops=_DROPS)

_DEFAULTS = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "mlp_ratio": 4, "hidden_act": "gelu", "layer_norm_eps": 1e-6, "image_size": 224,
             "patch_size": 14, "num_channels": 3, "qkv_bias": True, "layerscale_value": 1.0,
             "use_swiglu_ffn": False}


class HFDinov2Reader(HubReader):
    """`config.json` with `model_type: dinov2` (transformers' `Dinov2Config`, its defaults for
    absent fields); read only."""

    name: ClassVar[str] = "hf-dinov2"
    adapter: ClassVar[Adapter | None] = HF_DINOV2

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return raw.get("model_type") == "dinov2"

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        got = fields(raw, where, "HF DINOv2", _DEFAULTS)
        if classes(got):
            raise ConfigError(f"{where}: a Dinov2ForImageClassification's head reads the class "
                              "token and the patches' mean, which timm's ViT does not: only "
                              "Dinov2Model converts")
        width = got["hidden_size"]
        hidden = int(width * got["mlp_ratio"])
        mlp: dict[str, Any] = {"mlp_ratio": hidden / width,
                               "act_layer": activation(got["hidden_act"], where, "DINOv2")}
        if got["use_swiglu_ffn"]:  # two thirds of the hidden width, a multiple of 8, twice
            half = (int(hidden * 2 / 3) + 7) // 8 * 8
            mlp = {"mlp_ratio": 2 * half / width, "mlp_layer": "swiglu_packed",
                   "act_layer": "silu"}
        try:
            return ViTConfig(
                image_size=pair(got["image_size"]), patch_size=got["patch_size"],
                in_channels=got["num_channels"], width=width, depth=got["num_hidden_layers"],
                num_heads=got["num_attention_heads"], norm_eps=got["layer_norm_eps"],
                qkv_bias=got["qkv_bias"], init_values=float(got["layerscale_value"]),
                num_classes=0, dynamic_img_size=True, **mlp)
        except (TypeError, ZeroDivisionError, ConfigError) as e:
            raise ConfigError(f"{where}: invalid HF DINOv2 config: {e}") from e
