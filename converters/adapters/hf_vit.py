"""HF transformers ViT (`ViTModel`, `ViTForImageClassification`): its files' key layout
(`vit.encoder.layer.N.attention.attention.query`, `intermediate.dense`: what `save_pretrained`
writes and the Hub holds, in every release), the module names of transformers 5's
`model.state_dict()` (`vit.layers.N.attention.q_proj`, `mlp.fc1`), and `config.json`.

The zoo ViT with class-token pooling is the same function: q, k, v are fused into `qkv`,
`position_embeddings` include the class token, `layernorm_before/after` are `norm1/norm2`, the
final `vit.layernorm` is `norm`, `classifier` the `head`; the LayerNorm epsilon
(`layer_norm_eps`, 1e-12 by default) becomes the config's `norm_eps`. A `ViTModel` (no
classifier) is the zoo's ViT with `num_classes=0`, its output HF's `last_hidden_state[:, 0]`;
its pooler (a dense layer and tanh) has no counterpart in timm's ViT and is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.adapter import Adapter, Drop, Fuse, Rename
from converters.adapters.config_readers import HubReader
from converters.adapters.hf_common import POOLER, classes
from zoo.configs import Config, ConfigError
from zoo.models.vit.config import ViTConfig

_EMBEDDINGS = (Rename("vit.embeddings.cls_token", "cls_token"),
               Rename("vit.embeddings.position_embeddings", "pos_embed"),
               Rename("vit.embeddings.patch_embeddings.projection.{p}", "patch_embed.proj.{p}"))
_HEAD = (Rename("vit.layernorm.{p}", "norm.{p}"), Rename("classifier.{p}", "head.{p}"))
_GROUPS = (("embeddings.cls_token", "class token (vit.embeddings.cls_token)"),
           ("embeddings.position_embeddings",
            "position embeddings (vit.embeddings.position_embeddings)"),
           ("embeddings.patch_embeddings", "patch embedding (vit.embeddings.patch_embeddings)"))
_QKV = "query, key and value"


def _layout(name: str, description: str, block: str, renames: dict[str, str],
            qkv: tuple[str, str, str]) -> Adapter:
    """An HF ViT layout whose blocks live under `block` (with `{i}`)."""
    return Adapter(
        name=name, description=description, arch="vit", prefix="vit.", groups=_GROUPS,
        renames=(*_EMBEDDINGS, *(Rename(f"{block}.{hf}.{{p}}", f"blocks.{{i}}.{zoo}.{{p}}")
                                 for hf, zoo in renames.items()), *_HEAD),
        fuses=(Fuse(tuple(f"{block}.{q}.{{p}}" for q in qkv), "blocks.{i}.attn.qkv.{p}", _QKV),),
        drops=(Drop("vit.pooler.dense.{p}", POOLER),))


HF_VIT_MODULES = _layout(
    "hf-vit-modules", "HF transformers ViT (transformers 5 module names)", "vit.layers.{i}",
    {"attention.o_proj": "attn.proj", "layernorm_before": "norm1",
     "layernorm_after": "norm2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"},
    ("attention.q_proj", "attention.k_proj", "attention.v_proj"))
HF_VIT = _layout(
    "hf-vit", "HF transformers ViT", "vit.encoder.layer.{i}",
    {"attention.output.dense": "attn.proj", "layernorm_before": "norm1",
     "layernorm_after": "norm2", "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2"},
    ("attention.attention.query", "attention.attention.key", "attention.attention.value"))

# config.json fields with no effect on the eval-mode function (training, labels, bookkeeping)
_INERT = frozenset({
    "architectures", "attention_probs_dropout_prob", "hidden_dropout_prob", "dtype",
    "torch_dtype", "initializer_range", "label2id", "model_type", "transformers_version",
    "_name_or_path", "encoder_stride", "pooler_output_size", "pooler_act", "return_dict",
    "output_hidden_states", "output_attentions", "problem_type", "chunk_size_feed_forward",
    "is_encoder_decoder"})
_FIELDS = {"hidden_size": "width", "num_hidden_layers": "depth",
           "num_attention_heads": "num_heads", "patch_size": "patch_size",
           "num_channels": "in_channels", "layer_norm_eps": "norm_eps", "qkv_bias": "qkv_bias"}
_DEFAULTS = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
             "image_size": 224, "patch_size": 16, "num_channels": 3, "qkv_bias": True}


class HFViTReader(HubReader):
    """`config.json` with `model_type: vit` (transformers' `ViTConfig`, its defaults for
    absent fields)."""

    name: ClassVar[str] = "hf-vit"
    model_type: ClassVar[str] = "vit"
    arch: ClassVar[str] = "vit"
    claims_what: ClassVar[str] = "transformers model_type 'vit'"
    adapter: ClassVar[Adapter | None] = HF_VIT

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return raw.get("model_type") == self.model_type

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        unknown = sorted(set(raw) - _INERT - set(_DEFAULTS) - {"id2label", "num_labels"})
        if unknown:
            raise ConfigError(f"{where}: HF ViT config field(s) {', '.join(unknown)} have no "
                              "counterpart in the zoo's ViT")
        got = {**_DEFAULTS, **raw}
        if got["hidden_act"] != "gelu":
            raise ConfigError(f"{where}: hidden_act {got['hidden_act']!r}: the zoo's ViT uses "
                              "exact GELU ('gelu') only")
        image = got["image_size"]
        labels = classes(got)
        try:
            ratio = got["intermediate_size"] / got["hidden_size"]
            fields = {zoo: got[hf] for hf, zoo in _FIELDS.items()}
            return ViTConfig(**fields, mlp_ratio=ratio, num_classes=labels,
                             image_size=tuple(image) if isinstance(image, list)
                             else (image, image))
        except (TypeError, ZeroDivisionError) as e:
            raise ConfigError(f"{where}: invalid HF ViT config: {e}") from e

    def hub_config(self, config: Config) -> dict[str, Any]:
        if not isinstance(config, ViTConfig):
            raise ConfigError(f"an HF ViT config.json holds a vit, not a {config.arch}")
        same = ViTConfig(**{f: getattr(config, f) for f in (
            "image_size", "patch_size", "in_channels", "width", "depth", "num_heads",
            "mlp_ratio", "num_classes", "norm_eps", "qkv_bias")})
        if config != same:
            raise ConfigError(f"the HF ViT has no counterpart for vit {config.to_json()}: only "
                              "class-token pooling without timm's extra options")
        h, w = config.image_size
        if h != w:
            raise ConfigError(f"the HF ViT needs a square image, found image_size {h}x{w}")
        headless = config.num_classes == 0  # a ViTModel (transformers draws its pooler)
        return {"architectures": ["ViTModel" if headless else "ViTForImageClassification"],
                "model_type": "vit",
                "hidden_size": config.width, "num_hidden_layers": config.depth,
                "num_attention_heads": config.num_heads, "intermediate_size": config.mlp_hidden,
                "hidden_act": "gelu", "layer_norm_eps": config.norm_eps, "image_size": h,
                "patch_size": config.patch_size, "num_channels": config.in_channels,
                "qkv_bias": config.qkv_bias,
                "id2label": {str(i): f"LABEL_{i}" for i in range(config.num_classes)},
                "label2id": {f"LABEL_{i}": i for i in range(config.num_classes)}}
