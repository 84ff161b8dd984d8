"""Preprocessing equal to timm's, to the last bit, on real photographs (scikit-learn's two
sample JPEGs, 640x427): `zoo.data_config(name)` is timm's `resolve_data_config` of the tag's
pretrained config, and `zoo.transform(cfg)` gives what `timm.data.create_transform(**cfg)`
gives.

Tolerance 0: the zoo resizes with the same Pillow filter torchvision's `Resize` calls on a PIL
image, crops at the same offsets, and runs the same IEEE float32 operations (`x / 255`, then
`(x - mean) / std`) that torchvision's `ToTensor` and `Normalize` run, in the same order, so
every value is the same float.
"""

from __future__ import annotations

import numpy as np
import pytest

import zoo
from zoo.configs import ConfigError

timm = pytest.importorskip("timm")
sklearn_datasets = pytest.importorskip("sklearn.datasets")


@pytest.fixture(scope="module")
def photos():
    from PIL import Image

    return [Image.fromarray(a) for a in sklearn_datasets.load_sample_images().images]


def timm_batch(cfg, images):
    from timm.data import create_transform

    t = create_transform(**cfg)
    return np.stack([t(im).numpy() for im in images])


def table_configs() -> list[dict]:
    """Each distinct preprocessing of the table's tags (train and test sizes)."""
    seen = {}
    for name in zoo.list_pretrained():
        if zoo.weights.pretrained.resolve(name).pretrained.fields["library"] != "timm":
            continue  # token models: no image preprocessing
        for test in (False, True):
            cfg = zoo.data_config(name, use_test_size=test)
            seen.setdefault(repr(sorted(cfg.items())), cfg)
    return list(seen.values())


def test_data_config_is_timms_for_every_tag():
    from timm.data import resolve_data_config
    from timm.models import get_pretrained_cfg

    for name in zoo.list_pretrained():
        fields = zoo.weights.pretrained.resolve(name).pretrained.fields
        if fields["library"] != "timm":
            if fields["mean"] is None:  # token models
                with pytest.raises(ConfigError, match="no image preprocessing"):
                    zoo.data_config(name)
            continue
        for test in (False, True):
            want = resolve_data_config(pretrained_cfg=get_pretrained_cfg(name).to_dict(),
                                       use_test_size=test)
            assert zoo.data_config(name, use_test_size=test) == want, name
    untagged = zoo.data_config("resnet50")
    assert untagged == zoo.data_config(f"resnet50.{timm.models.get_pretrained_cfg('resnet50').tag}")


def test_two_tower_tags_preprocess_as_transformers_image_processors():
    """The CLIP and SigLIP tags' images are prepared as transformers' image processors
    prepare them: CLIP's resize of the shorter side then a center crop (timm's "center" at
    crop_pct 1), SigLIP's resize to the square ("squash"); bicubic; their means and stds."""
    import transformers
    from PIL import Image

    processors = {"clip": transformers.CLIPImageProcessor(),
                  "siglip": transformers.SiglipImageProcessor()}
    tagged = {name: zoo.weights.pretrained.resolve(name) for name in zoo.list_pretrained()}
    images = {n: r for n, r in tagged.items() if r.pretrained.fields["library"] != "timm"
              and r.pretrained.fields["mean"] is not None}
    assert {n.split("-")[0] for n in images} == set(processors)
    for name in images:
        processor = processors[name.split("-")[0]]
        cfg = zoo.data_config(name)
        assert cfg["mean"] == pytest.approx(processor.image_mean), name
        assert cfg["std"] == pytest.approx(processor.image_std), name
        assert cfg["interpolation"] == "bicubic", name
        assert processor.resample == Image.Resampling.BICUBIC, name
        cropped = bool(processor.do_center_crop)
        assert cfg["crop_mode"] == ("center" if cropped else "squash"), name
        side = (processor.crop_size if cropped else processor.size).height
        if cropped:  # the shorter side resized to the crop's: timm's crop_pct 1
            assert processor.size.shortest_edge == side, name
        assert cfg["input_size"] == (3, side, side) and cfg["crop_pct"] == 1.0, name


def test_every_preprocessing_of_the_table_equals_timms_bitwise(photos):
    configs = table_configs()
    assert len(configs) >= 10  # 15 with timm 1.0.31
    for cfg in configs:
        want = timm_batch(cfg, photos)
        got = zoo.transform(cfg)(photos)
        assert got.dtype == np.float32 and got.shape == want.shape, cfg
        np.testing.assert_array_equal(got, want, err_msg=str(cfg))


@pytest.mark.full_only
@pytest.mark.parametrize("mode", ["center", "squash", "border"])
def test_crop_modes_interpolations_and_odd_sizes_equal_timms_bitwise(photos, mode):
    """timm's other crop modes (no tag of the zoo's families uses them yet), every
    interpolation, a non-square target, and a target larger than the photo (padding)."""
    interps = ["bilinear", "bicubic", "nearest", "lanczos", "box", "hamming"]
    cases = [((3, 224, 224), interp, 0.875) for interp in interps]
    cases += [((3, 256, 192), "bicubic", 1.0), ((3, 500, 700), "bilinear", 0.95)]
    for size, interp, crop in cases:
        cfg = {"input_size": size, "interpolation": interp, "mean": (0.5, 0.4, 0.3),
               "std": (0.2, 0.25, 0.3), "crop_pct": crop, "crop_mode": mode}
        np.testing.assert_array_equal(zoo.transform(cfg)(photos[1]),
                                      timm_batch(cfg, photos[1:]), err_msg=str(cfg))


def test_images_as_arrays_paths_and_other_modes(photos, tmp_path):
    cfg = zoo.data_config("resnet50.tv_in1k")
    t = zoo.transform(cfg)
    want = t(photos[0])
    assert want.shape == (1, 3, 224, 224)
    np.testing.assert_array_equal(t(np.asarray(photos[0])), want)
    path = tmp_path / "photo.png"
    photos[0].save(path)
    np.testing.assert_array_equal(t(path), want)
    np.testing.assert_array_equal(t(photos[0].convert("RGBA")), want)  # alpha dropped
    gray = photos[0].convert("L")
    np.testing.assert_array_equal(t(np.asarray(gray)), t(gray.convert("RGB")))
    with pytest.raises(ConfigError, match="must be uint8"):
        t(np.asarray(photos[0], np.float32) / 255)
    with pytest.raises(ConfigError, match="not an image Pillow reads"):
        t(tmp_path / "missing.jpg")


@pytest.mark.parametrize("impl", ["eqx", "linen", "nnx", "torch"])
def test_batches_come_in_the_librarys_layout(photos, impl):
    cfg = zoo.data_config("vit_small_patch16_224")
    canonical = zoo.transform(cfg)(photos)
    got = zoo.transform(cfg, impl)(photos)
    want = canonical.transpose(0, 2, 3, 1) if impl in ("linen", "nnx") else canonical
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bad, said", [
    ({"crop_mode": "zoom"}, "crop_mode 'zoom'"),
    ({"interpolation": "cubic"}, "interpolation 'cubic'"),
    ({"mean": (0.5, 0.5)}, "mean needs 3 numbers"),
    ({"input_size": (224, 224)}, "input_size must be (channels, height, width)"),
    ({"crop_pct": 0}, "crop_pct must be a number"),
])
def test_bad_data_configs_are_refused_in_one_line(bad, said):
    cfg = {**zoo.data_config("resnet50"), **bad}
    with pytest.raises(ConfigError) as e:
        zoo.transform(cfg)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_data_config_needs_a_tag():
    with pytest.raises(ConfigError, match="no pretrained tag"):
        zoo.data_config("resnet20-cifar")
    with pytest.raises(ConfigError, match=r"not made by zoo\.create"):
        zoo.data_config(zoo.create(zoo.tiny_config("cnn"), "nnx"))
