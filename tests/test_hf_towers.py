"""HF transformers' DINOv2, CLIP and SigLIP image towers and Swin as their users have them: a
`save_pretrained` hub folder converts with one command (`python -m converters convert FOLDER
DST --to canonical`, the config read from `config.json`), a bare state dict in transformers 5's
module names through `converters.import_state`; each equals the `transformers` model itself
(its `pooler_output`, or a classifier's logits) in every library. Headless models convert to
the zoo's model with no head (`num_classes=0`)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import converters  # noqa: E402
import zoo  # noqa: E402
from converters.matching.verify import forward, max_difference, tolerance  # noqa: E402
from tests.converter_cli import cli  # noqa: E402

SMALL = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
         "image_size": 56, "patch_size": 14}
TOWER = {**SMALL, "intermediate_size": 32}
# name -> (model class, config class, config arguments, the output compared, layout names)
FAMILIES = {
    "dinov2": ("Dinov2Model", "Dinov2Config", SMALL, "pooler_output",
               ("hf-dinov2", "hf-dinov2-modules")),
    "dinov2_swiglu": ("Dinov2Model", "Dinov2Config", {**SMALL, "use_swiglu_ffn": True},
                      "pooler_output", ("hf-dinov2", "hf-dinov2-modules")),
    "clip": ("CLIPVisionModel", "CLIPVisionConfig", TOWER, "pooler_output",
             ("hf-clip-vision", "hf-clip-vision")),
    "siglip": ("SiglipVisionModel", "SiglipVisionConfig", TOWER, "pooler_output",
               ("hf-siglip-vision", "hf-siglip-vision")),
    # 28x28 then 14x14 tokens, window 7: 16 and 4 shifted windows (a stage the window does
    # not divide is refused: transformers pads before the shift, timm after)
    "swin": ("SwinModel", "SwinConfig",
             {"image_size": 56, "patch_size": 2, "embed_dim": 8, "depths": [2, 2],
              "num_heads": [1, 2], "window_size": 7}, "pooler_output",
             ("hf-swin", "hf-swin-modules")),
    "swin_classifier": ("SwinForImageClassification", "SwinConfig",
                        {"image_size": 32, "patch_size": 4, "embed_dim": 8, "depths": [2, 2],
                         "num_heads": [1, 2], "window_size": 4, "num_labels": 3}, "logits",
                        ("hf-swin", "hf-swin-modules")),
}


@functools.cache
def hf_model(family: str):
    """The transformers model of `family`, every parameter perturbed (transformers starts
    LayerNorms, biases and tokens at constants), in eval mode; eager attention."""
    cls, config_cls, kwargs, _, _ = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**kwargs, attn_implementation="eager")
    model = getattr(transformers, cls)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def hf_output(family: str, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = hf_model(family)(pixel_values=torch.from_numpy(x))
    return getattr(out, FAMILIES[family][3]).double().numpy()


def _input(config) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((2, *config.input_shape)).astype(
        np.float32)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hub_folder_converts_with_one_command_and_equals_transformers(family, tmp_path, capsys):
    hf_model(family).save_pretrained(tmp_path / "hf")
    capsys.readouterr()
    dst = tmp_path / "zoo.safetensors"
    code, out, err = cli(capsys, "convert", tmp_path / "hf", dst, "--to", "canonical")
    assert code == 0, err
    assert f"({FAMILIES[family][4][0]}), keys renamed" in out
    ck = converters.load(dst)
    x = _input(ck.config)
    want = hf_output(family, x)
    for impl in zoo.IMPLS:
        got = forward(converters.load(dst, impl), impl, x)
        assert max_difference(want, got) <= tolerance(), f"{family} {impl}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_state_dict_in_module_names_through_import_state(family, tmp_path):
    """transformers 5's in-memory names (q_proj, SwiGLU's gate/up/down projections, Swin's
    relative_position_bias module) through the Python API, with the folder's config."""
    model = hf_model(family)
    model.save_pretrained(tmp_path / "hf")
    config = converters.load(tmp_path / "hf").config
    res = converters.import_state(model.state_dict(), "torch", config)
    assert f"({FAMILIES[family][4][1]})" in res.notes[0]
    x = _input(config)
    got = forward(converters.from_canonical(res.state, config, "nnx"), "nnx", x)
    assert max_difference(hf_output(family, x), got) <= tolerance()


def test_the_configs_read_are_the_named_towers_options():
    """What each reader makes of transformers' defaults: DINOv2's LayerScale, SwiGLU and
    interpolated position embedding, CLIP's pre-norm and QuickGELU, SigLIP's attention pool
    and tanh GELU, no head for the headless models."""
    from converters.adapters import config_readers

    read = {name: config_readers.reader_for(cfg).config(cfg, name) for name, cfg in {
        "dinov2": {"model_type": "dinov2", "architectures": ["Dinov2Model"],
                   "use_swiglu_ffn": True, "hidden_size": 1536, "num_hidden_layers": 40,
                   "num_attention_heads": 24, "image_size": 518},
        "clip": {"model_type": "clip_vision_model", "patch_size": 16},
        "siglip": {"model_type": "siglip_vision_model", "hidden_size": 1152,
                   "intermediate_size": 4304, "num_hidden_layers": 27,
                   "num_attention_heads": 16, "image_size": 384, "patch_size": 14},
        "swin": {"model_type": "swin", "architectures": ["SwinForImageClassification"],
                 "num_labels": 1000}}.items()}
    named = {"dinov2": "vit_giant_patch14_dinov2", "clip": "vit_base_patch16_clip_quickgelu_224",
             "siglip": "vit_so400m_patch14_siglip_384", "swin": "swin_tiny_patch4_window7_224"}
    for family, name in named.items():
        want = zoo.make_config(name)
        got = read[family]
        differ = {f for f in want.to_dict() if getattr(got, f) != getattr(want, f)}
        expected = {"dinov2": {"dynamic_img_size", "init_values", "mlp_ratio"},  # 8192 / 1536
                    "clip": {"num_classes"},  # HF's tower has no projection head
                    "siglip": {"act_layer", "mlp_ratio"},  # tanh GELU; 4304 / 1152
                    "swin": set()}[family]
        assert differ == expected, (family, differ)
    assert read["siglip"].act_layer == "gelu_tanh" and read["siglip"].mlp_hidden == 4304
    assert read["dinov2"].mlp_hidden == zoo.make_config(named["dinov2"]).mlp_hidden == 8192


def test_what_is_left_out_is_said(tmp_path, capsys):
    """DINOv2's mask token and a ViTModel's pooler are left out, each with its reason."""
    hf_model("dinov2").save_pretrained(tmp_path / "hf")
    capsys.readouterr()
    code, out, err = cli(capsys, "convert", tmp_path / "hf", tmp_path / "z.safetensors",
                         "--to", "canonical")
    assert code == 0, err
    assert "left out 1 key(s) of the HF transformers DINOv2 layout: DINOv2's mask token" in out


def test_a_vit_model_converts_without_a_head(tmp_path, capsys):
    """A ViTModel (no classifier) is the zoo's ViT with num_classes=0: its output is the
    class token's features (HF's last_hidden_state[:, 0]); the pooler is left out."""
    torch.manual_seed(0)
    model = transformers.ViTModel(transformers.ViTConfig(
        hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
        image_size=8, patch_size=4)).eval()
    model.save_pretrained(tmp_path / "hf")
    capsys.readouterr()
    dst = tmp_path / "vit.safetensors"
    code, out, err = cli(capsys, "convert", tmp_path / "hf", dst, "--to", "canonical")
    assert code == 0, err
    assert "left out 2 key(s)" in out and "pooler" in out
    config = converters.load(dst).config
    assert config.num_classes == 0
    x = _input(config)
    with torch.no_grad():
        want = model(pixel_values=torch.from_numpy(x)).last_hidden_state[:, 0].numpy()
    for impl in zoo.IMPLS:
        assert max_difference(want, forward(converters.load(dst, impl), impl, x)) <= tolerance()


@pytest.mark.parametrize(("cfg", "named"), [
    ({"model_type": "swin", "image_size": [32, 48]}, "transformers shrinks windows"),
    ({"model_type": "swin", "use_absolute_embeddings": True}, "no absolute position"),
    ({"model_type": "swin", "image_size": 40, "patch_size": 2, "depths": [2, 2],
      "num_heads": [1, 2]}, r"stage 0's 20x20 tokens are not whole windows of 7"),
    ({"model_type": "siglip_vision_model", "vision_use_head": False}, "vision_use_head false"),
    ({"model_type": "dinov2", "architectures": ["Dinov2ForImageClassification"]},
     "only Dinov2Model converts"),
    ({"model_type": "clip_vision_model", "hidden_act": "relu"}, "hidden_act 'relu'"),
    ({"model_type": "dinov2", "frobnicate": 1}, r"field\(s\) frobnicate have no counterpart"),
])
def test_configs_without_counterpart_are_refused_by_name(cfg, named):
    from converters.adapters import config_readers

    with pytest.raises(zoo.ConfigError, match=named):
        config_readers.reader_for(cfg).config(cfg, "config.json")
