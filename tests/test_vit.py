"""The ViT's own guarantees beyond the registry-wide tests: timm's names and shapes, timm's
outputs (where timm is installed), the exact GELU, the pinned LayerNorm epsilon and a clear
refusal of another sequence length."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

import converters
import zoo
from canonical import ConversionError
from zoo.bench.presets import find_preset
from zoo.bench.spec import bench_spec
from zoo.models.vit.config import ViTConfig
from zoo.testing import assert_close

FIXTURE = Path(__file__).parent / "fixtures" / "named_timm_vit.json"
TIMM_TINY = json.loads(FIXTURE.read_text())["models"]["vit_tiny_patch16_224"]["state_dict"]


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_vit_tiny_has_timms_names_and_shapes(impl):
    """The default config is timm's vit_tiny_patch16_224: exactly its state_dict keys and
    shapes, in every library (a timm state_dict converts with no mapping)."""
    if impl == "torch":
        pytest.importorskip("torch")
    assert find_preset("vit-tiny", "vit").config == {}
    spec = converters.canonical_spec(ViTConfig(), impl=impl)
    assert {k: list(v.shape) for k, v in spec.items()} == TIMM_TINY
    assert sum(math.prod(s) for s in TIMM_TINY.values()) == 5_717_416


def test_gelu_is_exact_in_every_library():
    """jax.nn.gelu defaults to the tanh approximation: each library's MLP must use erf."""
    x = jnp.linspace(-4.0, 4.0, 101)
    exact = 0.5 * np.asarray(x) * (1 + scipy.special.erf(np.asarray(x) / np.sqrt(2)))
    assert np.abs(np.asarray(jax.nn.gelu(x)) - exact).max() > 1e-4  # the trap is real
    cfg = zoo.tiny_config("vit", width=1, num_heads=1, mlp_ratio=1.0)
    identity = {"weight": np.ones((1, 1), np.float32), "bias": np.zeros(1, np.float32)}
    state = {k: np.asarray(v) for k, v in zoo.canonical_init(cfg, seed=0).items()}
    for fc in ("fc1", "fc2"):
        state.update({f"blocks.0.mlp.{fc}.{k}": v for k, v in identity.items()})
    mlps = {
        "eqx": lambda m: jax.vmap(m.blocks[0].mlp)(x[:, None])[:, 0],
        "linen": lambda m: m[0].apply(m[1], x[:, None], method=lambda v, t: v.blocks[0].mlp(t))[
            :, 0],
        "nnx": lambda m: m.blocks[0].mlp(x[:, None])[:, 0],
    }
    for impl, mlp in mlps.items():
        model = converters.from_canonical(state, cfg, impl)
        assert_close(np.asarray(mlp(model)), exact, err_msg=impl)


def _epsilons(model, impl: str) -> set[float]:
    """The epsilon of every LayerNorm of a zoo ViT."""
    if impl == "eqx":
        import equinox as eqx

        norms = [m for m in jax.tree.leaves(model, is_leaf=lambda m: isinstance(
            m, eqx.nn.LayerNorm)) if isinstance(m, eqx.nn.LayerNorm)]
        return {m.eps for m in norms}
    if impl == "linen":
        module, variables = model
        return set(module.apply(variables, method=lambda m: [
            n.epsilon for b in m.blocks for n in (b.norm1, b.norm2)] + [m.norm.epsilon]))
    if impl == "nnx":
        from flax import nnx

        return {m.epsilon for _, m in nnx.iter_modules(model) if isinstance(m, nnx.LayerNorm)}
    import torch

    return {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)}


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_layer_norm_epsilon_is_the_configs(impl):
    """timm's 1e-6 by default (PyTorch's default is 1e-5, Flax's 1e-6): every LayerNorm
    carries the config's epsilon, in every library."""
    if impl == "torch":
        pytest.importorskip("torch")
    assert ViTConfig().norm_eps == 1e-6
    cfg = zoo.tiny_config("vit", norm_eps=3e-4)
    assert _epsilons(zoo.create(cfg, impl), impl) == {3e-4}


def test_another_sequence_length_is_refused():
    """Position-embedding resizing is out of scope: another image size is refused by the
    models and a state for another size by the converters, both naming the culprit."""
    cfg = zoo.tiny_config("vit")
    for impl in zoo.JAX_IMPLS:
        api = zoo.interface(impl)
        static, params, state = api.split(zoo.create(cfg, impl))
        x = zoo.example_input(zoo.tiny_config("vit", image_size=(12, 12)), batch=2)
        with pytest.raises(ValueError, match=r"vit expects \(3, 8, 8\) per sample, "
                                             r"got \(3, 12, 12\)"):
            api.apply(static, params, state, api.to_native(x))
    other = zoo.canonical_init(zoo.tiny_config("vit", image_size=(12, 12)))
    with pytest.raises(ConversionError, match=r"'pos_embed': expected shape \(1, 5, 8\), "
                                              r"found \(1, 10, 8\)"):
        converters.from_canonical(other, cfg, "nnx")


# --------------------------------------------------------------------------- timm itself
SMALL = dict(patch_size=8, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=7)
# timm's VisionTransformer options, one at a time and all together (timm's keyword names);
# vit_tiny_patch16_224 itself is checked in tests/test_named_models.py.
OPTIONS = {
    "default": {},
    "avg_pool_fc_norm": {"global_pool": "avg"},
    "avg_pool_norm": {"global_pool": "avg", "fc_norm": False},
    "no_class_token": {"class_token": False, "global_pool": "avg"},
    "no_qkv_bias": {"qkv_bias": False},
    "layer_scale": {"init_values": 0.1},
    "reg_tokens": {"reg_tokens": 2},
    "no_embed_class": {"no_embed_class": True, "reg_tokens": 1},
    "pre_norm": {"pre_norm": True},
    "all": {"global_pool": "avg", "class_token": False, "qkv_bias": False, "init_values": 0.1,
            "reg_tokens": 2, "no_embed_class": True, "pre_norm": True},
}


@functools.cache
def _timm_forward(option: str):
    """(state_dict, config, input, eval logits) of a small randomised timm VisionTransformer."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("timm", reason="timm is not installed")
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, embed_dim=48, **SMALL, **OPTIONS[option])
    with torch.no_grad():  # timm starts biases, tokens and LayerScale at constants: perturb all
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    cfg = ViTConfig(image_size=(32, 32), width=48, **SMALL, **OPTIONS[option])
    x = np.asarray(zoo.example_input(cfg, batch=2, seed=1))
    with torch.no_grad():
        y = model.eval()(torch.from_numpy(x.copy())).numpy()
    return model.state_dict(), cfg, x, y


@pytest.mark.parametrize("impl", zoo.IMPLS)
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_timm_options_reproduce_timm_outputs(option, impl):
    """A timm VisionTransformer's state_dict, built with each option, converts with no mapping
    into every library (timm's parameter names: fc_norm, reg_token, norm_pre, ls1/ls2.gamma)
    and reproduces timm's outputs."""
    state, cfg, x, y = _timm_forward(option)
    model = converters.from_canonical(state, cfg, impl)
    if impl == "torch":
        import torch

        with torch.no_grad():
            out = model.eval()(torch.from_numpy(x.copy())).numpy()
    else:
        api = zoo.interface(impl)
        static, params, st = api.split(model)
        out, _ = jax.jit(functools.partial(api.apply, static))(params, st, api.to_native(x))
    assert_close(np.asarray(out), y, err_msg=f"{option} {impl}")


def test_useful_flops_of_vit_tiny_are_timms():
    """timm lists vit_tiny_patch16_224 at 1.26 GMACs per image: the benchmark's FLOP floor."""
    useful_flops = bench_spec("vit").flops_floor
    flops = useful_flops(ViTConfig(), 1, "forward")
    assert flops == pytest.approx(2 * 1.26e9, rel=0.01)  # tolerance: timm prints 3 digits
    assert useful_flops(ViTConfig(), 2, "train") < 3 * useful_flops(ViTConfig(), 2, "forward")
