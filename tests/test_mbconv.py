"""EfficientNet and MobileNetV3 against timm's own models: the named configs are timm's models
(keys, shapes, feature taps), every name cut to one block per stage computes timm's logits,
reduced-depth and full-depth models equal timm's in all four libraries (eval and train mode,
gradients with respect to every parameter), drop path draws the same masks everywhere, any
input size runs, and bad block strings are refused in one line.

timm's models are built by timm (`timm.create_model`, or its classes through
`tests/timm_mbconv.py` for the tiny configs), with every array randomised (BatchNorm statistics
perturbed). Relative differences are max |zoo - timm| / max |timm|.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import converters
import zoo
from tests.kind_cover import cover
from tests.timm_mbconv import one_block_per_stage, randomise, timm_model
from zoo.registry import schema
from zoo.runtime import fast, precision

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm", reason="timm is not installed")

NAMES = (*(f"{tf}efficientnet_b{i}" for tf in ("", "tf_") for i in range(5)),
         "mobilenetv3_large_100", "mobilenetv3_small_100")
REDUCED = ("efficientnet_b0", "tf_efficientnet_b0", "mobilenetv3_large_100",
           "mobilenetv3_small_100")
FULL = ("efficientnet_b0", "mobilenetv3_large_100")
GRADIENTS = ("tf_efficientnet_b0", "mobilenetv3_small_100")
RTOL = precision.tolerance("float32")  # relative to the largest output / gradient


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def _timm_cut(name: str, num_classes: int = 10):
    """timm's `name`, cut to the first block of every stage (as timm built it), randomised."""
    with torch.device("meta"):
        model = timm.create_model(name, num_classes=num_classes)
    for i, stage in enumerate(model.blocks):
        model.blocks[i] = stage[:1]
    return randomise(model.to_empty(device="cpu"))


def _cut_config(name: str, **overrides) -> zoo.Config:
    """The zoo config of `name` cut as `_timm_cut` cuts timm's model."""
    named = zoo.make_config(name)
    return zoo.make_config(name, arch_def=one_block_per_stage(named.arch_def),
                           depth_multiplier=1.0, **overrides)


def _input(config: zoo.Config, batch: int, size: tuple[int, int], seed: int = 1) -> np.ndarray:
    return np.array(jax.random.normal(jax.random.key(seed),
                                      (batch, config.in_channels, *size)), np.float32)


# --------------------------------------------------------------------------- the configs
@pytest.mark.parametrize("name", NAMES)
def test_named_configs_are_timms_models(name):
    """timm's classes built from the zoo's config (tests/timm_mbconv.py) are timm's named model
    module for module (so the helper states timm's builder), and the zoo's feature taps and
    their channels are timm's `stage_ends` / `feature_info`. On the meta device."""
    config = zoo.make_config(name)
    with torch.device("meta"):
        theirs, helper = timm.create_model(name), timm_model(config)
    assert repr(helper) == repr(theirs)
    assert config.stage_ends == tuple(theirs.stage_ends)
    stages = config.stages()
    chs = [config.stem_chs if e == 0 else stages[e - 1][-1].out_chs for e in config.stage_ends]
    assert chs == [f["num_chs"] for f in theirs.feature_info]


@pytest.mark.parametrize("arch", ["efficientnet", "mobilenetv3"])
def test_tiny_configs_are_timms(arch):
    """The tests' tiny configs (the registry-wide tests run them in every library) are timm
    models too: the same state_dict, the same logits in eval and train mode."""
    config = zoo.tiny_config(arch)
    reference = randomise(timm_model(config))
    model = converters.from_canonical(reference.state_dict(), config, "torch")
    x = torch.from_numpy(_input(config, 3, config.input_size))
    for train in (False, True):
        reference.train(train), model.train(train)
        with torch.no_grad():
            assert _rel(model(x), reference(x)) < 1e-6


@pytest.mark.parametrize("name", NAMES)
def test_every_name_at_one_block_per_stage_computes_timms_logits(name):
    """The zoo's PyTorch model of every name, cut to one block per stage as timm's is, loads
    timm's state_dict strictly and gives its logits in eval and train mode (the JAX libraries
    equal it: test_equivalence, and below)."""
    reference = _timm_cut(name)
    config = _cut_config(name, num_classes=10)
    model = converters.from_canonical(reference.state_dict(), config, "torch")
    x = torch.from_numpy(_input(config, 2, (64, 48)))
    for train in (False, True):
        reference.train(train), model.train(train)
        with torch.no_grad():
            err = _rel(model(x), reference(x))
        assert err < 1e-6, f"{name} train={train}: relative error {err:.2e}"


# --------------------------------------------------------------------------- every library
@functools.cache
def _timm_results(name: str, full: bool, size: tuple[int, int], batch: int):
    """timm's model of `name` (full depth or cut), its input, eval logits, and in train mode
    the logits and the gradients of <logits, cotangent> with respect to every parameter."""
    if full:
        reference = randomise(timm.create_model(name, num_classes=10))
        config = zoo.make_config(name, num_classes=10)
    else:
        reference, config = _timm_cut(name), _cut_config(name, num_classes=10)
    x = _input(config, batch, size)
    state = {k: v.detach().numpy().copy() for k, v in reference.state_dict().items()}
    reference.eval()
    with torch.no_grad():
        y_eval = reference(torch.from_numpy(x)).numpy()
    reference.train()  # (updates the running statistics: `state` holds them before)
    y = reference(torch.from_numpy(x))
    cotangent = np.array(jax.random.normal(jax.random.key(7), y.shape), np.float32)  # writable
    (y * torch.from_numpy(cotangent)).sum().backward()
    grads = {k: p.grad.numpy() for k, p in reference.named_parameters()}
    return config, state, x, y_eval, y.detach().numpy(), cotangent, grads


def _jax_results(impl: str, config, state, x, cotangent, grads: bool):
    """Eval logits; train logits and (`grads`) the canonical parameter gradients."""
    api = zoo.interface(impl)
    static, params, st = api.split(converters.from_canonical(state, config, impl))
    xn = api.to_native(jnp.asarray(x))
    evaluate = jax.jit(lambda p, s, v: api.apply(static, p, s, v, train=False)[0])
    y_eval = np.asarray(api.to_canonical(evaluate(params, st, xn)))

    def loss(p):
        y = api.to_canonical(api.apply(static, p, st, xn, train=True)[0])
        return jnp.sum(y * cotangent), y

    if not grads:
        return y_eval, np.asarray(jax.jit(loss)(params)[1]), None
    (_, y_train), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    canon = converters.to_canonical(api.merge(static, g, st), impl)
    return y_eval, np.asarray(y_train), {k: np.asarray(v) for k, v in canon.items()}


def _check_every_library(name: str, impl: str, *, full: bool, size, batch, grads: bool):
    config, state, x, want_eval, want_train, cotangent, want_grads = _timm_results(
        name, full, size, batch)
    if impl == "torch":
        model = converters.from_canonical(state, config, "torch")
        with torch.no_grad():
            got_eval = model.eval()(torch.from_numpy(x)).numpy()
            got_train = model.train()(torch.from_numpy(x)).numpy()
        got_grads = None
    else:
        got_eval, got_train, got_grads = _jax_results(impl, config, state, x, cotangent, grads)
    errors = {"eval": _rel(got_eval, want_eval), "train": _rel(got_train, want_train)}
    if got_grads is not None:
        assert set(got_grads) >= set(want_grads), set(want_grads) - set(got_grads)
        # Reported per parameter relative to its largest entry, but for a bias feeding a
        # train-mode BatchNorm through linear layers only: its gradient is zero (the mean is
        # subtracted), timm's rounding noise ~1e-8 of the largest gradient.
        top = max(np.abs(g).max() for g in want_grads.values())
        errors["grads"] = max(_rel(got_grads[k], g) for k, g in want_grads.items()
                              if np.abs(g).max() > 1e-6 * top)
    print(f"{name} {'full' if full else 'cut'} {impl}: " + ", ".join(
        f"{k} {v:.1e}" for k, v in errors.items()))
    assert errors["eval"] < RTOL and errors["train"] < RTOL, errors
    if got_grads is not None:  # elementwise, as the registry-wide tests (atol scaled here)
        for k, g in want_grads.items():
            np.testing.assert_allclose(got_grads[k], g, rtol=RTOL, atol=RTOL * top, err_msg=k)


@pytest.mark.parametrize(("name", "impl"), cover(REDUCED, zoo.IMPLS))
def test_one_block_per_stage_in_every_library_is_timms(name, impl):
    """EfficientNet-B0 (and its TensorFlow port's SAME padding and eps), MobileNetV3 large and
    small at their widths, one block per stage: timm's logits in eval and train mode, each
    name in one library, the four in turn (--exhaustive: every library); for the TensorFlow
    port and the small MobileNetV3 the gradients of every parameter too (the tiny configs'
    are compared in test_equivalence / test_torch_reference)."""
    _check_every_library(name, impl, full=False, size=(64, 48), batch=4,
                         grads=name in GRADIENTS)


@pytest.mark.parametrize(("name", "impl"), cover(FULL, zoo.IMPLS))
def test_full_depth_in_every_library_is_timms(name, impl):
    """efficientnet_b0 and mobilenetv3_large_100 at full depth: timm's logits in eval and
    train mode, each in one library (--exhaustive: every library; 96x80, so that train-mode
    BatchNorm of the last stages normalises over more than a handful of values)."""
    _check_every_library(name, impl, full=True, size=(96, 80), batch=2, grads=False)


# --------------------------------------------------------------------------- drop path
# One MBConv body draws the masks for both (--exhaustive: MobileNetV3 too).
@pytest.mark.parametrize("arch", ["efficientnet",
                                  pytest.param("mobilenetv3", marks=pytest.mark.exhaustive)])
def test_drop_path_one_key_same_outputs_in_every_library(arch):
    """With drop path (rate 0.5 at the last block, timm's linear rule) in training, one raw key
    draws the same masks in Equinox (through its interface), Linen (`key=`) and NNX (`rngs=`):
    the same outputs, and PyTorch's given those masks too; in eval the rate changes nothing."""
    from zoo.layers.drop_path import block_keys, keep_mask

    config = zoo.tiny_config(arch, drop_path_rate=0.5)
    rates = [b.drop_path for stage in config.stages() for b in stage]
    assert rates == [0.5 * i / len(rates) for i in range(len(rates))]
    state = zoo.canonical_init(config, seed=1)
    n, key = 8, jax.random.key(5)
    x = np.array(zoo.example_input(config, batch=n, seed=1))  # writable: torch shares it
    outs = {}
    for impl in ("eqx", "nnx"):
        api = zoo.interface(impl)
        model = converters.from_canonical(state, config, impl)
        y, _ = fast.forward(model, impl, train=True)(api.to_native(x), key)
        outs[impl] = np.asarray(api.to_canonical(y))
    module, variables = converters.from_canonical(state, config, "linen")
    outs["linen"] = np.asarray(jax.jit(functools.partial(
        module.apply, train=True, mutable=["batch_stats"]))(
        variables, jnp.moveaxis(x, 1, -1), key=key)[0])
    model = converters.from_canonical(state, config, "torch").train()
    blocks = [b for stage in model.blocks for b in stage]
    samples = jax.random.split(key, n)
    for i, block in enumerate(blocks):
        block.drop_path.keep = torch.from_numpy(np.array(keep_mask(
            block_keys(samples, i), n, max(rates[i], 1e-6))))
    with torch.no_grad():
        outs["torch"] = model(torch.from_numpy(x)).numpy()
        undropped = converters.from_canonical(state, zoo.tiny_config(arch), "torch").train()(
            torch.from_numpy(x)).numpy()
    assert _rel(undropped, outs["torch"]) > 1e-2, "no branch dropped: the test proves nothing"
    for impl, y in outs.items():
        assert _rel(y, outs["eqx"]) < 1e-6, impl
    api = zoo.native_interface("nnx")
    evaluated = api.forward(converters.from_canonical(state, config, "nnx"), api.to_native(x))
    plain = api.forward(converters.from_canonical(state, zoo.tiny_config(arch), "nnx"),
                        api.to_native(x))
    np.testing.assert_array_equal(np.asarray(evaluated), np.asarray(plain))


# --------------------------------------------------------------------------- input sizes
@pytest.mark.parametrize("padding", ["torch", "same"])
@pytest.mark.parametrize("arch", ["efficientnet", "mobilenetv3"])
def test_any_input_size_runs_as_timms(arch, padding):
    """timm's models run from 1x1 on (global pooling; strided convs give at least one output):
    the zoo accepts every size, and computes timm's logits at odd and even ones."""
    config = zoo.tiny_config(arch, padding=padding)
    reference = randomise(timm_model(config)).eval()
    model = converters.from_canonical(reference.state_dict(), config, "torch").eval()
    nnx_model = converters.from_canonical(reference.state_dict(), config, "nnx")
    api = zoo.native_interface("nnx")
    for size in ((1, 1), (2, 3), (7, 5), (33, 16)):
        x = _input(config, 2, size)
        with torch.no_grad():
            want = reference(torch.from_numpy(x)).numpy()
            assert _rel(model(torch.from_numpy(x)), want) < 1e-6, size
        got = api.to_canonical(api.forward(nnx_model, api.to_native(x)))
        assert _rel(got, want) < 1e-5, size


# --------------------------------------------------------------------------- torchvision's layouts
TORCHVISION = {**{f"efficientnet_b{i}": "torchvision-efficientnet" for i in range(5)},
               "mobilenet_v3_large": "torchvision-mobilenet-v3-large",
               "mobilenet_v3_small": "torchvision-mobilenet-v3-small"}


@pytest.mark.parametrize("name", sorted(TORCHVISION))
def test_torchvision_names_are_the_adapters(name):
    """torchvision's named EfficientNets and MobileNetV3s (meta device, no weights): their
    layout is found by their keys, maps them onto the zoo's named config of the same name,
    every shape included (MobileNetV3's first classifier Linear is conv_head, reshaped), and
    back in torchvision's order."""
    torchvision = pytest.importorskip("torchvision")
    with torch.device("meta"):
        state = {k: np.zeros(tuple(v.shape), np.float32) for k, v in
                 torchvision.models.get_model(name, weights=None).state_dict().items()}
    config = zoo.make_config(name, input_size=(32, 32))
    adapter = converters.adapters.find(state, config.arch)
    assert adapter is not None and adapter.name == TORCHVISION[name]
    zoo_state = adapter.to_zoo(state)
    spec = schema(config)[1]
    assert {k: v.shape for k, v in zoo_state.items()} == {k: tuple(v.shape)
                                                          for k, v in spec.items()}
    assert list(adapter.from_zoo({k: zoo_state[k] for k in spec})) == list(state)


@functools.cache
def _torchvision(name: str):
    """torchvision's model `name` (10 classes, no dropout or stochastic depth, so that
    training mode is deterministic), every array randomised; EfficientNet-B0 cut to the first
    block of every stage. Its zoo config, state_dict, an input, eval and train outputs."""
    torchvision = pytest.importorskip("torchvision")
    extra = {"stochastic_depth_prob": 0.0} if name.startswith("efficientnet") else {}
    with torch.device("meta"):
        model = torchvision.models.get_model(name, weights=None, num_classes=10, dropout=0.0,
                                             **extra)
    config = zoo.make_config(name, num_classes=10)
    if name.startswith("efficientnet"):
        for s in range(1, 8):
            model.features[s] = model.features[s][:1]
        config = _cut_config(name, num_classes=10)
    model = randomise(model.to_empty(device="cpu"), seed=2)
    state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    x = _input(config, 2, (64, 48), seed=3)
    with torch.no_grad():
        outs = [model.train(train)(torch.from_numpy(x)).numpy() for train in (False, True)]
    return config, state, x, *outs


@pytest.mark.parametrize(("name", "impl"), cover(["efficientnet_b0", "mobilenet_v3_small"],
                                                 zoo.IMPLS, per_case=2))
def test_torchvision_state_dicts_compute_torchvisions_outputs(name, impl):
    """torchvision's EfficientNet-B0 (one block per stage) and MobileNetV3-small state_dicts,
    through their layouts, give torchvision's outputs in eval and train mode in every
    library."""
    config, state, x, want_eval, want_train = _torchvision(name)
    model = converters.from_canonical(converters.adapters.find(state).to_zoo(state), config,
                                      impl)
    if impl == "torch":
        with torch.no_grad():
            got = [model.train(t)(torch.from_numpy(x)).numpy() for t in (False, True)]
    else:
        api = zoo.interface(impl)
        static, params, st = api.split(model)
        run = jax.jit(lambda p, s, v, train: api.apply(static, p, s, v, train=train)[0],
                      static_argnames="train")
        got = [api.to_canonical(run(params, st, api.to_native(x), train=t)) for t in (False, True)]
    errors = [_rel(got[0], want_eval), _rel(got[1], want_train)]
    print(f"torchvision {name} {impl}: eval {errors[0]:.1e}, train {errors[1]:.1e}")
    assert max(errors) < RTOL, errors


def test_torchvision_mobilenet_v3_large_is_the_named_config_and_not_timms_eps():
    """torchvision's large MobileNetV3 at full depth is `mobilenet_v3_large` (the zoo's PyTorch
    model, eval and train); with timm's BatchNorm eps (`mobilenetv3_large_100`) the same
    weights compute another function."""
    config, state, x, want_eval, want_train = _torchvision("mobilenet_v3_large")
    zoo_state = converters.adapters.find(state).to_zoo(state)
    model = converters.from_canonical(zoo_state, config, "torch")
    with torch.no_grad():
        assert _rel(model.eval()(torch.from_numpy(x)), want_eval) < RTOL
        assert _rel(model.train()(torch.from_numpy(x)), want_train) < RTOL
        timms = converters.from_canonical(zoo_state, zoo.make_config(
            "mobilenetv3_large_100", num_classes=10), "torch").eval()
        assert _rel(timms(torch.from_numpy(x)), want_eval) > 1e-4


def test_torchvision_files_convert_both_ways_by_one_command(tmp_path, capsys):
    """A torchvision MobileNetV3-small state_dict into NNX by one command (its layout
    recognised and named), and back by one command into a file torchvision loads strictly:
    the same arrays, bitwise."""
    from tests.converter_cli import cli

    torchvision = pytest.importorskip("torchvision")
    _, state, x, want_eval, _ = _torchvision("mobilenet_v3_small")
    src = tmp_path / "mobilenet_v3_small.pt"
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, src)
    code, out, err = cli(capsys, "convert", src, tmp_path / "nnx", "--to", "nnx", "--arch",
                         "mobilenet_v3_small", "--config", '{"num_classes": 10}')
    assert code == 0, err
    assert "layout: torchvision MobileNetV3 (small) (torchvision-mobilenet-v3-small)" in out
    api = zoo.native_interface("nnx")
    got = api.to_canonical(api.forward(converters.load(tmp_path / "nnx", "nnx"),
                                       api.to_native(x)))
    assert _rel(got, want_eval) < RTOL
    back = tmp_path / "back.pt"
    code, out, err = cli(capsys, "convert", tmp_path / "nnx", back, "--to", "torch",
                         "--layout", "torchvision-mobilenet-v3-small")
    assert code == 0, err
    fresh = torchvision.models.mobilenet_v3_small(num_classes=10)
    fresh.load_state_dict(torch.load(back, weights_only=True), strict=True)
    for k, v in fresh.state_dict().items():
        if not k.endswith("num_batches_tracked"):  # the JAX libraries keep no batch counter
            np.testing.assert_array_equal(v.numpy(), state[k], err_msg=k)


@pytest.mark.parametrize("name", ["tf_efficientnet_b0", "mobilenetv3_small_100"])
def test_timm_hub_folder_converts_without_arch(name, tmp_path, capsys):
    """A timm hub folder (`save_for_hf`, offline) of a TensorFlow port and of a MobileNetV3:
    its config.json's architecture names the zoo's config (the tf_ port's SAME padding and eps
    included), the weights load with no mapping, the zoo's model gives timm's outputs."""
    from timm.models import save_for_hf

    from tests.converter_cli import cli

    reference = randomise(timm.create_model(name, num_classes=7)).eval()
    folder = tmp_path / name
    folder.mkdir()
    save_for_hf(reference, str(folder), safe_serialization=True,
                data_config={"input_size": (3, 64, 48)})
    dst = tmp_path / "out.pt"
    code, out, err = cli(capsys, "convert", folder, dst, "--to", "torch")
    assert code == 0, err
    assert "timm hub folder" in out
    config = converters.load(dst).config
    assert config == zoo.make_config(name, num_classes=7, input_size=(64, 48))
    x = _input(config, 2, (64, 48))
    with torch.no_grad():
        got = converters.load(dst, "torch").eval()(torch.from_numpy(x)).numpy()
        assert _rel(got, reference(torch.from_numpy(x))) < RTOL


# --------------------------------------------------------------------------- padding warning
def test_a_flax_source_into_torch_padding_is_warned_once():
    """The tf_ ports pad as TensorFlow's SAME, as Flax's convolutions do by default; a Flax
    tree the zoo did not build going into a config that pads as PyTorch gets one warning naming
    the field and --config (`Config.PADDING`); with "same" it is silent, and the imported
    state computes the Flax model's outputs."""
    import warnings

    from converters.matching.transfer import import_state
    from zoo.configs import PaddingWarning

    same = zoo.tiny_config("efficientnet", padding="same")
    module, variables = zoo.create(same, "linen", seed=0)
    tree = {k: dict(v) for k, v in variables.items()}  # a Flax checkpoint's plain tree
    with pytest.warns(PaddingWarning, match=r"""pass --config '\{"padding": "same"\}'""") as said:
        import_state(tree, "linen", zoo.tiny_config("efficientnet"))
    assert len(said) == 1 and "\n" not in str(said[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PaddingWarning)
        state = import_state(tree, "linen", same).state
    x = _input(same, 2, (10, 8))  # even sizes: SAME pads (0, 1) at stride 2
    model = converters.from_canonical(state, same, "torch").eval()
    with torch.no_grad():
        got = model(torch.from_numpy(x)).numpy()
    want = np.asarray(module.apply(variables, jnp.moveaxis(x, 1, -1)))
    assert _rel(got, want) < RTOL


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("overrides", "match"), [
    ({"arch_def": (("ir_r1_k3_s2_e6_c24_gs8",),)}, "option 'gs8' is not one the zoo builds"),
    ({"arch_def": (("er_r1_k3_s1_e4_c24",),)}, "type 'er' is not one of ds, dsa, ir, cn"),
    ({"arch_def": (("ir_k3_s2_e6_c24",),)}, "option 'r' is missing"),
    ({"arch_def": (("ir_r1_k3_s3_e6_c24",),)}, "the stride 1 or 2"),
    ({"arch_def": (("ir_r1_k3_s2_e6_c24",),) * 5}, "reduces the input 64x"),
    ({"arch_def": ((),)}, "at least one stage of at least one block"),
    ({"channel_multiplier": 0.0}, "must be positive"),
    ({"drop_path_rate": 1.0}, r"drop_path_rate must be in \[0, 1\)"),
    ({"act": "gelu"}, "MobileNetV3Config.act"),
])
def test_bad_configs_are_refused_in_one_line(overrides, match):
    with pytest.raises(zoo.ConfigError, match=match) as info:
        zoo.tiny_config("mobilenetv3", **overrides)
    assert "\n" not in str(info.value)
