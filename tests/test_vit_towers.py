"""The ViT options of the published towers, each forward-equal to timm in all four libraries:
DeiT's distillation token and second head, DINOv2's position embedding resampled to the input
size (`dynamic_img_size`) and SwiGLU MLP, CLIP's QuickGELU, SigLIP's attention-pool head
(`global_pool="map"`), the tanh GELU, no head (`num_classes=0`); gradients of DeiT's head
equal in the four libraries; drop path drawn alike from one key; a headless model loading a
classifier's checkpoint. The named towers' keys, shapes and parameter counts are pinned in
tests/test_named_models.py (tests/fixtures/named_timm_vit_towers.json)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import converters
import zoo
from zoo.layers.drop_path import block_keys, sample_keep
from zoo.runtime import fast
from zoo.testing import assert_close

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm", reason="timm is not installed")

SMALL = {"patch_size": 8, "depth": 2, "num_heads": 3, "mlp_ratio": 2.0, "num_classes": 7}
# timm's keyword names and values; the zoo's config fields have the same names.
OPTIONS = {
    "map": {"global_pool": "map", "class_token": False},
    "map_reg_tokens": {"global_pool": "map", "class_token": False, "reg_tokens": 2,
                       "no_embed_class": True},
    "swiglu_packed": {"mlp_layer": "swiglu_packed", "act_layer": "silu", "init_values": 1e-5},
    "quick_gelu": {"act_layer": "quick_gelu", "pre_norm": True, "norm_eps": 1e-5},
    "gelu_tanh": {"act_layer": "gelu_tanh"},
    "no_head": {"num_classes": 0},
    "distilled": {"distilled": True},
    "distilled_no_head": {"distilled": True, "num_classes": 0},
    "dynamic_img_size": {"dynamic_img_size": True, "reg_tokens": 2, "init_values": 0.1},
    "dynamic_no_embed_class": {"dynamic_img_size": True, "reg_tokens": 4,
                               "no_embed_class": True},
}
# other input sizes for the options that take them (non-square, smaller and larger)
SIZES = {"dynamic_img_size": [(32, 32), (48, 24), (16, 16)],
         "dynamic_no_embed_class": [(32, 32), (24, 40)]}
TOL = 1e-5  # relative: max |zoo - timm| / max |timm|


def _timm_kwargs(options: dict) -> dict:
    out = {k: v for k, v in options.items() if k not in ("distilled", "norm_eps")}
    if options.get("mlp_layer") == "swiglu_packed":
        out["mlp_layer"] = timm.layers.SwiGLUPacked
    if "norm_eps" in options:
        out["norm_layer"] = functools.partial(torch.nn.LayerNorm, eps=options["norm_eps"])
    return out


@functools.cache
def _timm_model(option: str):
    """timm's model with `option`, every parameter perturbed (timm starts biases, tokens and
    LayerScale at constants), in eval mode; the zoo's config of it."""
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    options = OPTIONS[option]
    cls = VisionTransformerDistilled if options.get("distilled") else VisionTransformer
    model = cls(img_size=32, embed_dim=48, **_timm_kwargs({**SMALL, **options})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    config = zoo.make_config("vit", image_size=(32, 32), width=48, **{**SMALL, **options})
    return model, config


def _run(impl: str, model, x: np.ndarray) -> np.ndarray:
    api = zoo.native_interface(impl)
    return np.asarray(api.to_canonical(api.forward(model, api.to_native(x))))


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_options_reproduce_timm(option):
    """timm's state_dict converts with no mapping into every library and gives timm's
    outputs (at every input size the option takes)."""
    reference, config = _timm_model(option)
    models = {impl: converters.from_canonical(reference.state_dict(), config, impl)
              for impl in zoo.IMPLS}
    for size in SIZES.get(option, [(32, 32)]):
        x = np.random.default_rng(1).standard_normal((2, 3, *size)).astype(np.float32)
        with torch.no_grad():
            want = reference(torch.from_numpy(x)).numpy()
        assert want.shape == (2, config.num_classes or config.width)
        for impl, model in models.items():
            got = _run(impl, model, x)
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err < TOL, f"{option} {impl} at {size}: relative error {err:.2e}"


def _gradients(impl: str, config, state, x: np.ndarray, cotangent: np.ndarray) -> dict:
    """The canonical gradient of <output, cotangent> in training mode (no drop path)."""
    if impl == "torch":
        model = converters.from_canonical(state, config, "torch").train()
        (model(torch.from_numpy(x)) * torch.from_numpy(cotangent)).sum().backward()
        return {k: p.grad.numpy() for k, p in model.named_parameters()}
    api = zoo.interface(impl)
    static, params, st = api.split(converters.from_canonical(state, config, impl))

    def loss(params):
        y, _ = api.apply(static, params, st, api.to_native(jnp.asarray(x)), train=True)
        return jnp.sum(api.to_canonical(y) * cotangent)

    grads = jax.jit(jax.grad(loss))(params)
    return {k: np.asarray(v) for k, v in
            converters.to_canonical(api.merge(static, grads, st), impl).items()}


def test_distilled_gradients_agree_in_every_library():
    """DeiT's two heads and tokens (the `towers` variant runs the other options through the
    registry-wide gradient tests): every parameter's gradient equal in the four libraries."""
    config = zoo.tiny_config("vit", distilled=True, act_layer="gelu_tanh")
    state = {k: np.asarray(v) for k, v in zoo.canonical_init(config, seed=1).items()}
    x = np.array(zoo.example_input(config, batch=3, seed=2))
    cotangent = np.random.default_rng(3).standard_normal((3, config.num_classes)).astype(
        np.float32)
    grads = {impl: _gradients(impl, config, state, x, cotangent) for impl in zoo.IMPLS}
    for key in ("dist_token", "head_dist.weight", "cls_token", "head.weight"):
        assert np.abs(grads["torch"][key]).max() > 0, key
    for impl in zoo.JAX_IMPLS:
        assert set(grads[impl]) == set(grads["torch"])
        for k, g in grads["torch"].items():
            assert_close(grads[impl][k], g, err_msg=f"{impl} {k}")


def test_drop_path_draws_alike_from_one_key():
    """Drop path in training: Equinox (per sample, through its interface), Linen and NNX given
    the same key drop the same samples of the same blocks (sample i's key split(key, N)[i],
    block b's two drop paths folded in 2b and 2b + 1), and PyTorch given those masks agrees."""
    rate = 0.5
    config = zoo.tiny_config("vit", depth=3, drop_path_rate=rate)
    state = zoo.canonical_init(config, seed=0)
    x = np.array(zoo.example_input(config, batch=6, seed=1))
    key = jax.random.key(5)
    outs = {}
    for impl in ("eqx", "nnx"):
        api = zoo.interface(impl)
        model = converters.from_canonical(state, config, impl)
        y, _ = fast.forward(model, impl, train=True)(api.to_native(x), key)
        outs[impl] = np.asarray(api.to_canonical(y))
    module, variables = converters.from_canonical(state, config, "linen")
    outs["linen"] = np.asarray(jax.jit(functools.partial(module.apply, train=True))(
        variables, jnp.asarray(x).transpose(0, 2, 3, 1), key=key))
    model = converters.from_canonical(state, config, "torch").train()
    samples = jax.random.split(key, 6)
    for b, block in enumerate(model.blocks):
        rate_b = config.drop_path_rates()[b]
        for j, layer in enumerate((block.drop_path1, block.drop_path2)):
            keep = jax.vmap(lambda k, r=rate_b: sample_keep(k, r))(
                block_keys(samples, 2 * b + j))
            layer.keep = torch.from_numpy(np.array(keep))
    with torch.no_grad():
        outs["torch"] = model(torch.from_numpy(x)).numpy()
    with torch.no_grad():
        eval_out = model.eval()(torch.from_numpy(x)).numpy()
    assert np.abs(outs["torch"] - eval_out).max() > 1e-3, "no block was dropped"
    for impl, y in outs.items():
        assert_close(y, outs["eqx"], err_msg=impl)


def test_a_headless_model_loads_a_classifiers_checkpoint():
    """num_classes=0 (timm's towers): the checkpoint's head is dropped, as timm's
    `load_pretrained`, and the output is the pooled features: the classifier's pre-logits."""
    options = {**zoo.tiny_config("vit").TINY, "global_pool": "map", "class_token": False}
    config = zoo.make_config("vit", **options)
    state = zoo.canonical_init(config, seed=2)
    with pytest.warns(UserWarning, match="dropped head"):
        model = zoo.create("vit", "nnx", weights=state, **{**options, "num_classes": 0})
    x = np.asarray(zoo.example_input(config, batch=2))
    classifier = converters.from_canonical(state, config, "nnx")
    want = zoo.native_interface("nnx").call(classifier, "forward_features",
                                            x.transpose(0, 2, 3, 1))
    want = classifier.forward_head(want, pre_logits=True)
    assert_close(_run("nnx", model, x), np.asarray(want))
    assert model.config.output_shape == (config.width,)


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_reset_classifier_to_no_head_and_back(impl):
    """reset_classifier(0) leaves the pooled features as the output (DeiT: the mean of its two
    tokens), reset_classifier(n) adds fresh heads again, in every library."""
    config = zoo.tiny_config("vit", distilled=True)
    model = zoo.create(config, impl, seed=0)
    api = zoo.native_interface(impl)
    x = api.to_native(np.asarray(zoo.example_input(config, batch=2)))
    features = api.call(model, "forward_features", x)
    pre_logits = api.call(model, "forward_head", features, pre_logits=True)
    if impl == "eqx":
        headless = model.reset_classifier(0, key=jax.random.key(0))
        again = headless.reset_classifier(4, key=jax.random.key(1))
    elif impl == "linen":
        headless = model[0].reset_classifier(model[1], 0, key=jax.random.key(0))
        again = headless[0].reset_classifier(headless[1], 4, key=jax.random.key(1))
    else:
        headless, again = api.clone(model), api.clone(model)
        kw = {"rngs": __import__("flax").nnx.Rngs(0)} if impl == "nnx" else {}
        headless.reset_classifier(0, **kw)
        again.reset_classifier(4, **kw)
    assert_close(np.asarray(api.forward(headless, x)), np.asarray(pre_logits))
    assert np.asarray(api.forward(again, x)).shape == (2, 4)
    keys = set(converters.to_canonical(again, impl))
    assert {"head.weight", "head_dist.weight"} <= keys
    assert not {k for k in converters.to_canonical(headless, impl) if k.startswith("head")}


def test_dynamic_img_size_takes_patch_multiples():
    """With dynamic_img_size the input axes are free multiples of the patch; without it the
    size is exact (the position embedding's length depends on it)."""
    free = zoo.tiny_config("vit", dynamic_img_size=True)
    free.check_input((2, 3, 12, 20))
    with pytest.raises(zoo.ConfigError, match="a multiple of 4"):
        free.check_input((2, 3, 10, 8))
    with pytest.raises(zoo.ConfigError, match=r"vit expects \(3, 8, 8\)"):
        zoo.tiny_config("vit").check_input((2, 3, 12, 20))
