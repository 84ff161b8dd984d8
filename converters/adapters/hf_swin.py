"""HF transformers Swin (`SwinModel`, `SwinForImageClassification`, `model_type: swin`): its
files' key layout (`encoder.layers.N.blocks.M.attention.self.query`, `intermediate.dense`,
`encoder.layers.N.downsample` at the end of stage N), the module names of transformers 5's
`state_dict()` (`attention.q_proj`, `attention.relative_position_bias.*`, `mlp.fc1`), and
`config.json`.

The zoo's Swin (timm's) is the same function: q, k, v are fused into `qkv`,
`layernorm_before/after` are `norm1/norm2`, stage N's patch merging is timm's
`layers.{N+1}.downsample` (timm merges at the start of a stage), `classifier` is `head.fc`; a
`SwinModel` (no classifier) is the zoo's Swin with `num_classes=0`, its output HF's
`pooler_output`. The `relative_position_index` buffers are derived from the window: left out
(every library computes them). Where the two differ the reader refuses: transformers shrinks a
window to the smaller side of a stage's resolution, timm per side (the same for square images);
transformers pads a stage the window does not divide before the cyclic shift, timm after it
(another function; no published Swin needs padding). (transformers 5 keeps a stage smaller
than the window at the config's window, where it fails; its earlier releases and timm shrink
the window.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from converters.adapters.adapter import Adapter, Drop, Fuse, Rename
from converters.adapters.config_readers import HubReader
from converters.adapters.hf_common import activation, classes, fields, pair
from zoo.configs import Config, ConfigError
from zoo.models.swin.config import SwinConfig

_S = "swin."
_BLOCK = _S + "encoder.layers.{i}.blocks.{j}"
_ZOO = "layers.{i}.blocks.{j}"
_INDEX = "the relative position index (a buffer derived from the window)"
_OUTSIDE = (Rename(_S + "embeddings.patch_embeddings.projection.{p}", "patch_embed.proj.{p}"),
            Rename(_S + "embeddings.norm.{p}", "patch_embed.norm.{p}"),
            Rename(_S + "encoder.layers.{i}.downsample.reduction.weight",
                   "layers.{i+1}.downsample.reduction.weight"),
            Rename(_S + "encoder.layers.{i}.downsample.norm.{p}",
                   "layers.{i+1}.downsample.norm.{p}"),
            Rename(_S + "layernorm.{p}", "norm.{p}"), Rename("classifier.{p}", "head.fc.{p}"))
_GROUPS = (("embeddings.patch_embeddings", "patch embedding (embeddings.patch_embeddings)"),)


def _layout(name: str, description: str, names: dict[str, str], qkv: tuple[str, str, str],
            table: str) -> Adapter:
    return Adapter(
        name=name, description=description, arch="swin", prefix=_S, groups=_GROUPS,
        renames=(*_OUTSIDE, *(Rename(f"{_BLOCK}.{hf}.{{p}}", f"{_ZOO}.{zoo}.{{p}}")
                              for hf, zoo in names.items()),
                 Rename(f"{_BLOCK}.{table}.relative_position_bias_table",
                        f"{_ZOO}.attn.relative_position_bias_table")),
        fuses=(Fuse(tuple(f"{_BLOCK}.{n}.{{p}}" for n in qkv), f"{_ZOO}.attn.qkv.{{p}}",
                    "query, key and value"),),
        drops=(Drop(f"{_BLOCK}.{table}.relative_position_index", _INDEX),))


_NORMS = {"layernorm_before": "norm1", "layernorm_after": "norm2"}
HF_SWIN = _layout(
    "hf-swin", "HF transformers Swin",
    {**_NORMS, "attention.output.dense": "attn.proj", "intermediate.dense": "mlp.fc1",
     "output.dense": "mlp.fc2"},
    ("attention.self.query", "attention.self.key", "attention.self.value"), "attention.self")
HF_SWIN_MODULES = _layout(
    "hf-swin-modules", "HF transformers Swin (transformers 5 module names)",
    {**_NORMS, "attention.o_proj": "attn.proj", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"},
    ("attention.q_proj", "attention.k_proj", "attention.v_proj"),
    "attention.relative_position_bias")

_DEFAULTS = {"image_size": 224, "patch_size": 4, "num_channels": 3, "embed_dim": 96,
             "depths": [2, 2, 6, 2], "num_heads": [3, 6, 12, 24], "window_size": 7,
             "mlp_ratio": 4.0, "qkv_bias": True, "hidden_act": "gelu",
             "use_absolute_embeddings": False, "layer_norm_eps": 1e-5, "hidden_size": None,
             "num_layers": None, "path_norm": True}


class HFSwinReader(HubReader):
    """`config.json` with `model_type: swin` (transformers' `SwinConfig`, its defaults for
    absent fields); read only."""

    name: ClassVar[str] = "hf-swin"
    adapter: ClassVar[Adapter | None] = HF_SWIN

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return raw.get("model_type") == "swin"

    def config(self, raw: Mapping[str, Any], where: str) -> Config:
        got = fields(raw, where, "HF Swin", _DEFAULTS)
        if got["use_absolute_embeddings"]:
            raise ConfigError(f"{where}: use_absolute_embeddings: timm's Swin has no absolute "
                              "position embedding")
        if activation(got["hidden_act"], where, "Swin") != "gelu":
            raise ConfigError(f"{where}: hidden_act {got['hidden_act']!r}: timm's Swin uses "
                              "the exact GELU ('gelu')")
        (h, w), (ph, pw) = pair(got["image_size"]), pair(got["patch_size"])
        if h != w or ph != pw:
            raise ConfigError(f"{where}: image_size {h}x{w}, patch_size {ph}x{pw}: transformers "
                              "shrinks windows by a stage's smaller side, timm by each side; "
                              "they agree for square images and patches only")
        for i in range(len(got["depths"])):
            side = h // ph
            for _ in range(i):
                side = (side + 1) // 2
            if side > got["window_size"] and side % got["window_size"]:
                raise ConfigError(
                    f"{where}: stage {i}'s {side}x{side} tokens are not whole windows of "
                    f"{got['window_size']}: transformers pads them before its cyclic shift, "
                    "timm after (another function)")
        try:
            return SwinConfig(
                image_size=(h, w), patch_size=ph, in_channels=got["num_channels"],
                embed_dim=got["embed_dim"], depths=tuple(got["depths"]),
                num_heads=tuple(got["num_heads"]), window_size=got["window_size"],
                mlp_ratio=float(got["mlp_ratio"]), qkv_bias=got["qkv_bias"],
                norm_eps=got["layer_norm_eps"], num_classes=classes(got))
        except (TypeError, ConfigError) as e:
            raise ConfigError(f"{where}: invalid HF Swin config: {e}") from e
