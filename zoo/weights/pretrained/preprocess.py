"""Preprocessing equal to timm's: `data_config(model_or_name)` and `transform(data_config, impl)`.

`data_config` resolves as timm's `resolve_model_data_config` does (input size, interpolation,
mean, std, crop_pct, crop_mode of the model's pretrained tag; timm's defaults for what a tag
leaves out; ``use_test_size`` takes the tag's test size and crop). `transform` is timm's eval
transform (`timm.data.create_transform(**data_config)`), written with Pillow and NumPy:

1. resize with Pillow, by the tag's interpolation (Pillow's filters are what torchvision's
   `Resize` calls on a PIL image): ``center`` mode scales the short edge to
   ``floor(size / crop_pct)`` (torchvision's `Resize(int)`; timm's `ResizeKeepRatio` for a
   non-square target), ``squash`` scales both edges, ``border`` scales the long edge;
2. center crop to the input size (torchvision's `CenterCrop` offsets, zero padding when
   smaller; ``border`` pads with the mean colour as timm's `CenterCropOrPad`);
3. ``x / 255`` then ``(x - mean) / std`` in float32, the operations torchvision's `ToTensor`
   and `Normalize` run, in the same order.

The same Pillow resize and the same IEEE float32 operations give the same bits: the
preprocessing tests compare with timm's own transform at tolerance 0 on scikit-learn's sample
photographs. Images are converted to RGB first (as timm's dataset loader does).
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo.configs import Config, ConfigError
from zoo.weights.pretrained.table import Pretrained

# timm's defaults (timm.data.constants) for what a pretrained config leaves out.
IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT = 0.875
DEFAULT_CROP_MODE = "center"
DEFAULTS: dict[str, Any] = {"input_size": (3, 224, 224), "interpolation": "bicubic",
                            "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD,
                            "crop_pct": DEFAULT_CROP_PCT, "crop_mode": DEFAULT_CROP_MODE}
CROP_MODES = ("center", "squash", "border")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")

# Models made by zoo.create(..., pretrained=True): id -> (weak reference, their tag).
_MADE: dict[int, tuple[weakref.ref, Pretrained]] = {}


def remember(model: Any, pretrained: Pretrained) -> None:
    """Record that native `model` (or its first element: Equinox `(model, state)`, Linen
    `(module, variables)`) holds `pretrained`'s weights, for `data_config(model)`."""
    obj = model[0] if isinstance(model, tuple) else model
    key = id(obj)
    try:
        ref = weakref.ref(obj, lambda _: _MADE.pop(key, None))
    except TypeError:
        return
    _MADE[key] = (ref, pretrained)


def made_from(model: Any) -> Pretrained | None:
    """The tag whose weights `zoo.create(..., pretrained=True)` put into `model`, if any."""
    obj = model[0] if isinstance(model, tuple) else model
    entry = _MADE.get(id(obj))
    return entry[1] if entry is not None and entry[0]() is obj else None


def resolve_data_config(pretrained_cfg: Mapping[str, Any], use_test_size: bool = False
                        ) -> dict[str, Any]:
    """timm's `resolve_data_config(pretrained_cfg=...)`: the preprocessing fields of a
    pretrained config, timm's defaults for the missing ones."""
    cfg = {k: v for k, v in pretrained_cfg.items() if v is not None}
    size = (cfg.get("test_input_size") if use_test_size else None) or cfg.get("input_size")
    crop = (cfg.get("test_crop_pct") if use_test_size else None) or cfg.get("crop_pct")
    out = {"input_size": tuple(size or DEFAULTS["input_size"]),
           "interpolation": cfg.get("interpolation") or DEFAULTS["interpolation"],
           "mean": tuple(cfg.get("mean") or DEFAULTS["mean"]),
           "std": tuple(cfg.get("std") or DEFAULTS["std"]),
           "crop_pct": crop or DEFAULTS["crop_pct"],
           "crop_mode": cfg.get("crop_mode") or DEFAULTS["crop_mode"]}
    return check_data_config(out)


def check_data_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`cfg` with every field a transform needs, of the right kind; ConfigError naming the
    field otherwise."""
    missing = [k for k in DEFAULTS if k not in cfg]
    if missing:
        raise ConfigError(f"data config lacks {', '.join(missing)} (zoo.data_config gives all)")
    size = tuple(cfg["input_size"])
    if len(size) != 3 or not all(isinstance(s, int) and s > 0 for s in size):
        raise ConfigError(f"data config input_size must be (channels, height, width), found "
                          f"{cfg['input_size']!r}")
    if cfg["interpolation"] not in INTERPOLATIONS:
        raise ConfigError(f"data config interpolation {cfg['interpolation']!r}: one of "
                          f"{', '.join(INTERPOLATIONS)}")
    if cfg["crop_mode"] not in CROP_MODES:
        raise ConfigError(f"data config crop_mode {cfg['crop_mode']!r}: one of "
                          f"{', '.join(CROP_MODES)}")
    crop = cfg["crop_pct"]
    if isinstance(crop, bool) or not isinstance(crop, int | float) or not 0 < crop <= 4:
        raise ConfigError(f"data config crop_pct must be a number in (0, 4], found {crop!r}")
    for key in ("mean", "std"):
        value = tuple(cfg[key])
        if len(value) != size[0] or not all(isinstance(v, int | float) for v in value):
            raise ConfigError(f"data config {key} needs {size[0]} numbers (one per input "
                              f"channel), found {cfg[key]!r}")
    if any(v == 0 for v in cfg["std"]):
        raise ConfigError("data config std has a zero")
    return {"input_size": size, "interpolation": cfg["interpolation"],
            "mean": tuple(cfg["mean"]), "std": tuple(cfg["std"]), "crop_pct": crop,
            "crop_mode": cfg["crop_mode"]}


def _pil_filter(name: str) -> int:
    from PIL import Image

    return {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
            "bicubic": Image.Resampling.BICUBIC, "box": Image.Resampling.BOX,
            "hamming": Image.Resampling.HAMMING, "lanczos": Image.Resampling.LANCZOS}[name]


def load_image(image: Any) -> Any:
    """A PIL RGB image from a PIL image, a path, or a uint8 array (H, W, 3) or (H, W)."""
    from PIL import Image

    if isinstance(image, str | os.PathLike):
        try:
            with Image.open(Path(image)) as img:
                return img.convert("RGB")
        except OSError as e:
            raise ConfigError(f"{image}: not an image Pillow reads ({e})") from e
    if isinstance(image, Image.Image):
        return image if image.mode == "RGB" else image.convert("RGB")
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim not in (2, 3) or (arr.ndim == 3 and
                                                           arr.shape[2] not in (1, 3, 4)):
        raise ConfigError(f"an image array must be uint8 shaped (H, W, 3) or (H, W) (what "
                          f"PIL and imageio give), found {arr.dtype} {arr.shape}")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    return Image.fromarray(arr).convert("RGB")


def _resize(img: Any, size_hw: tuple[int, int], interpolation: str) -> Any:
    h, w = size_hw
    if (img.height, img.width) == (h, w):
        return img  # torchvision's resize returns the image as it is
    return img.resize((w, h), _pil_filter(interpolation))


def _center_crop(arr: np.ndarray, size_hw: tuple[int, int], fill: Sequence[int]) -> np.ndarray:
    """torchvision's `center_crop` (timm's `center_crop_or_pad` with a fill colour) on an
    (H, W, C) array: pad to at least the size, then crop at the rounded center."""
    ch, cw = size_hw
    h, w = arr.shape[:2]
    if ch > h or cw > w:
        top, left = max(ch - h, 0) // 2, max(cw - w, 0) // 2
        out = np.empty((max(h, ch), max(w, cw), arr.shape[2]), arr.dtype)
        out[...] = np.asarray(fill, arr.dtype)
        out[top:top + h, left:left + w] = arr
        arr, (h, w) = out, out.shape[:2]
        if (h, w) == (ch, cw):
            return arr
    top = round((h - ch) / 2.0)  # torchvision: int(round(...))
    left = round((w - cw) / 2.0)
    return arr[top:top + ch, left:left + cw]


def resized(img: Any, cfg: Mapping[str, Any]) -> np.ndarray:
    """The resized and cropped image (H, W, 3) uint8, as timm's eval transform makes it."""
    _, th, tw = cfg["input_size"]
    crop_pct = cfg["crop_pct"]
    scale = (math.floor(th / crop_pct), math.floor(tw / crop_pct))
    fill = [0, 0, 0]
    if cfg["crop_mode"] == "squash":
        img = _resize(img, scale, cfg["interpolation"])
    elif cfg["crop_mode"] == "border":  # ResizeKeepRatio(longest=1), CenterCropOrPad
        ratio = max(img.height / scale[0], img.width / scale[1])
        img = _resize(img, (round(img.height / ratio), round(img.width / ratio)),
                      cfg["interpolation"])
        fill = [round(255 * v) for v in cfg["mean"]]
    elif scale[0] == scale[1]:  # torchvision's Resize(int): the short edge
        short, long = sorted((img.height, img.width))
        new_long = int(scale[0] * long / short)
        img = _resize(img, (scale[0], new_long) if img.height <= img.width
                      else (new_long, scale[0]), cfg["interpolation"])
    else:  # ResizeKeepRatio(longest=0)
        ratio = min(img.height / scale[0], img.width / scale[1])
        img = _resize(img, (round(img.height / ratio), round(img.width / ratio)),
                      cfg["interpolation"])
    return _center_crop(np.asarray(img, np.uint8), (th, tw), fill)


@dataclass(frozen=True)
class Transform:
    """Images (PIL, paths or uint8 arrays; one or a list) to a float32 batch in a library's
    layout: `data_config`'s resize, crop and normalisation, then channels last for Flax."""

    data_config: Mapping[str, Any]
    impl: str = "canonical"

    def canonical(self, images: Any) -> np.ndarray:
        """The batch channels-first, (N, C, H, W), whatever the library."""
        cfg = self.data_config
        many = isinstance(images, list | tuple)
        batch = [resized(load_image(im), cfg) for im in (images if many else [images])]
        x = np.stack(batch).transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255)
        mean = np.asarray(cfg["mean"], np.float32)[:, None, None]
        std = np.asarray(cfg["std"], np.float32)[:, None, None]
        return (x - mean) / std

    def __call__(self, images: Any) -> np.ndarray:
        x = self.canonical(images)
        if self.impl == "canonical":
            return x
        from zoo.libraries import native_interface

        return np.asarray(native_interface(self.impl).to_native(x))


def transform(data_config: Mapping[str, Any], impl: str = "canonical") -> Transform:
    """timm's eval transform for `data_config` (`zoo.data_config(...)`), returning batches in
    library `impl`'s layout ("eqx", "torch" and "canonical" channels-first, "linen" and "nnx"
    channels-last)."""
    if impl != "canonical":
        from zoo.libraries import IMPLS

        if impl not in IMPLS:
            raise ConfigError(f"unknown library {impl!r}; libraries: {list(IMPLS)}")
    return Transform(check_data_config(data_config), impl)


def _image_fields(tag: Pretrained) -> dict[str, Any]:
    """The fields of an image model's tag; ConfigError for a tag with no image preprocessing
    (a language model's: token ids in)."""
    if tag.fields.get("input_size") is None and tag.fields.get("mean") is None:
        raise ConfigError(f"{tag}: its weights ({tag.fields.get('library')}) come with no image "
                          "preprocessing (a model of token ids)")
    return tag.fields


def data_config(model_or_name: Any, *, use_test_size: bool = False) -> dict[str, Any]:
    """The preprocessing of a pretrained model, as timm's `resolve_model_data_config`:
    `model_or_name` is a name (``resnet50.a1_in1k``; an untagged name means its default tag),
    a ``hf-hub:`` / ``local-dir:`` source whose ``config.json`` is timm's, a `Pretrained` tag,
    or a model `zoo.create(..., pretrained=True)` made."""
    from zoo.weights.pretrained.resolving import resolve
    from zoo.weights.sources import Source

    if isinstance(model_or_name, Pretrained):
        return resolve_data_config(_image_fields(model_or_name), use_test_size)
    if isinstance(model_or_name, str):
        source = Source.parse(model_or_name)
        if source is not None:
            raw = source.config_json()
            cfg = raw.get("pretrained_cfg") if raw else None
            if not isinstance(cfg, dict):
                raise ConfigError(f"{source}: no timm pretrained_cfg in its config.json (the "
                                  "preprocessing of other folders is not read): pass a data "
                                  "config")
            return resolve_data_config(cfg, use_test_size)
        found = resolve(model_or_name).pretrained
        if found is None:
            raise ConfigError(f"{model_or_name} has no pretrained tag, so no preprocessing is "
                              "known (zoo.list_pretrained() lists the names that have)")
        return resolve_data_config(_image_fields(found), use_test_size)
    if isinstance(model_or_name, Config):
        raise ConfigError("a config says nothing about preprocessing: pass the model's name "
                          "with its tag (resnet50.a1_in1k)")
    made = made_from(model_or_name)
    if made is None:
        raise ConfigError(f"this {type(model_or_name).__name__} was not made by "
                          "zoo.create(..., pretrained=True): pass its name with its tag")
    return resolve_data_config(made.fields, use_test_size)
