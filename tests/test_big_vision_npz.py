"""The original Flax ViT releases' `.npz` files, written here as google-research/vision_transformer
and big_vision write them (the Flax parameter tree flattened with `/`, `np.savez`): the original
names (`MultiHeadDotProductAttention_1`, `MlpBlock_3`, `LayerNorm_2`), a training state's
`opt/target/`, big_vision's names under `params/` with scanned (stacked) blocks, and a SigLIP
two-tower file (`params/img/` with its `MAPHead_0`, the text tower beside it). Each converts with
one command (`python -m converters convert FILE.npz DST --to canonical --arch ...`) and equals
timm loading the same file with its own `vision_transformer._load_weights`, in every library."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm", reason="timm is not installed")

import converters  # noqa: E402
import zoo  # noqa: E402
from converters.matching.verify import forward, max_difference, tolerance  # noqa: E402
from tests.converter_cli import cli  # noqa: E402

E, HEADS, DEPTH, MLP, PATCH, IMAGE, CLASSES = 48, 3, 2, 96, 8, 32, 7
GRID = (IMAGE // PATCH) ** 2
SIZES = {"image_size": [IMAGE, IMAGE], "patch_size": PATCH, "width": E, "depth": DEPTH,
         "num_heads": HEADS, "mlp_ratio": MLP / E}


def _params(rng: np.random.Generator, *, big_vision: bool, siglip: bool = False) -> dict:
    """A Flax ViT parameter tree of random values, with the module names of `big_vision` (or
    of google-research/vision_transformer), the SigLIP image tower's MAP head or a class token
    and a classifier."""
    def a(*shape):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)

    d = E // HEADS
    mha, ln2, mlp = (("MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")
                     if big_vision else ("MultiHeadDotProductAttention_1", "LayerNorm_2",
                                         "MlpBlock_3"))

    def attention():
        return {**{n: {"kernel": a(E, HEADS, d), "bias": a(HEADS, d)}
                   for n in ("query", "key", "value")},
                "out": {"kernel": a(HEADS, d, E), "bias": a(E)}}

    def norm():
        return {"scale": 1 + a(E), "bias": a(E)}

    def mlp_block(width=MLP):
        return {"Dense_0": {"kernel": a(E, width), "bias": a(width)},
                "Dense_1": {"kernel": a(width, E), "bias": a(E)}}

    blocks = {f"encoderblock_{i}": {"LayerNorm_0": norm(), mha: attention(), ln2: norm(),
                                    mlp: mlp_block()} for i in range(DEPTH)}
    tree = {"embedding": {"kernel": a(PATCH, PATCH, 3, E), "bias": a(E)},
            "Transformer": {**blocks, "encoder_norm": norm()}}
    tokens = GRID if siglip else GRID + 1
    if big_vision:
        tree["pos_embedding"] = a(1, tokens, E)
    else:
        tree["Transformer"]["posembed_input"] = {"pos_embedding": a(1, tokens, E)}
    if siglip:
        tree["MAPHead_0"] = {"probe": a(1, 1, E), "MultiHeadDotProductAttention_0": attention(),
                             "LayerNorm_0": norm(), "MlpBlock_0": mlp_block()}
        tree["head"] = {"kernel": a(E, E), "bias": a(E)}  # the projection to the joint space
    else:
        tree["cls"] = a(1, 1, E)
        tree["head"] = {"kernel": a(E, CLASSES), "bias": a(CLASSES)}
    return tree


def _scanned(tree: dict) -> dict:
    """big_vision's scanned encoder: one `encoderblock` whose arrays stack the blocks."""
    blocks = [tree["Transformer"].pop(f"encoderblock_{i}") for i in range(DEPTH)]

    def stack(*xs):
        return (np.stack(xs) if not isinstance(xs[0], dict)
                else {k: stack(*(x[k] for x in xs)) for k in xs[0]})

    tree["Transformer"]["encoderblock"] = stack(*blocks)
    return tree


def _flat(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = v
    return out


def _files(tmp_path, rng):
    """name -> (npz path, timm model arguments, zoo config overrides, CLI options)."""
    vit = {"class_token": True, "num_classes": CLASSES}
    siglip = {"class_token": False, "global_pool": "map", "num_classes": 0}
    files = {
        "vision_transformer": ({"": _params(rng, big_vision=False)}, vit, []),
        "vision_transformer_train_state": (
            {"opt/target/": _params(rng, big_vision=False)}, vit, []),
        "big_vision_scanned": ({"params/": _scanned(_params(rng, big_vision=True))}, vit, []),
        "big_vision_siglip": (
            {"params/img/": _scanned(_params(rng, big_vision=True, siglip=True)),
             "params/": {"txt": {"Encoder_0": {"kernel": np.zeros((3, 3), np.float32)}},
                         "t": np.ones(1, np.float32), "b": np.zeros(1, np.float32)}},
            siglip, ["--num-classes", "0"])}
    out = {}
    for name, (parts, options, flags) in files.items():
        flat = {k: v for prefix, tree in parts.items() for k, v in _flat(tree, prefix).items()}
        path = tmp_path / f"{name}.npz"
        np.savez(path, **flat)
        out[name] = (path, options, flags)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return _files(tmp_path_factory.mktemp("npz"), np.random.default_rng(0))


@pytest.mark.parametrize("name", ["vision_transformer", "vision_transformer_train_state",
                                  "big_vision_scanned", "big_vision_siglip"])
def test_npz_converts_with_one_command_and_equals_timms_load_weights(name, files, tmp_path,
                                                                     capsys):
    from timm.models.vision_transformer import VisionTransformer, _load_weights

    path, options, flags = files[name]
    reference = VisionTransformer(img_size=IMAGE, patch_size=PATCH, embed_dim=E, depth=DEPTH,
                                  num_heads=HEADS, mlp_ratio=MLP / E, **options).eval()
    _load_weights(reference, str(path))
    config = {**SIZES, **options}
    dst = tmp_path / "vit.safetensors"
    code, out, err = cli(capsys, "convert", path, dst, "--to", "canonical", "--arch", "vit",
                         "--config", json.dumps({k: v for k, v in config.items()
                                                 if k != "num_classes" or not flags}),
                         *flags)
    assert code == 0, err
    assert "(big-vision-vit), keys renamed" in out
    x = np.random.default_rng(1).standard_normal((2, 3, IMAGE, IMAGE)).astype(np.float32)
    with torch.no_grad():
        want = reference(torch.from_numpy(x)).numpy()
    for impl in zoo.IMPLS:
        got = forward(converters.load(dst, impl), impl, x)
        assert max_difference(want, got) <= tolerance(), f"{name} {impl}"


def test_scanned_and_unscanned_files_hold_the_same_state(tmp_path):
    """A scanned file reads as the per-block one: the same canonical arrays."""
    tree = _params(np.random.default_rng(2), big_vision=True)
    np.savez(tmp_path / "flat.npz", **_flat(tree, "params/"))
    np.savez(tmp_path / "scanned.npz", **_flat(_scanned(tree), "params/"))
    config = zoo.make_config("vit", **{**SIZES, "image_size": (IMAGE, IMAGE),
                                       "num_classes": CLASSES})
    a = converters.load(tmp_path / "flat.npz", "canonical", config=config)
    b = converters.load(tmp_path / "scanned.npz", "canonical", config=config)
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
