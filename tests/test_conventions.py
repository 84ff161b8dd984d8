"""Pins of the library conventions the zoo relies on (docs/conventions.md).

If a library changes one of these behaviours, the test that pins it fails and names it.
"""

from __future__ import annotations

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import canonical
import converters
import zoo
from zoo.layers.batch_norm import BatchNorm
from zoo.testing import assert_close


def _x(shape, seed=0, loc=0.0):
    return jax.random.normal(jax.random.key(seed), shape) + loc


# ----------------------------------------------------------------------------- BatchNorm
def _flax_bn_steps(xs, momentum=0.9):
    """Training outputs and final (mean, var) of Linen BatchNorm over NHWC batches."""
    bn = nn.BatchNorm(momentum=momentum, use_fast_variance=False)
    variables = bn.init(jax.random.key(0), xs[0], use_running_average=False)
    outs = []
    for x in xs:
        y, upd = bn.apply(variables, x, use_running_average=False, mutable=["batch_stats"])
        variables = {**variables, **upd}
        outs.append(y)
    eval_y = bn.apply(variables, xs[0], use_running_average=True)
    return outs, variables["batch_stats"], eval_y


def _eqx_bn_steps(layer_cls, xs, **kwargs):
    """Same with an Equinox BatchNorm (per-sample NCHW, vmapped over the batch)."""
    bn, state = eqx.nn.make_with_state(layer_cls)(3, axis_name="batch", **kwargs)
    call = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    outs = []
    for x in xs:
        y, state = call(jnp.moveaxis(x, -1, 1), state)
        outs.append(jnp.moveaxis(y, 1, -1))
    infer = eqx.nn.inference_mode(bn)
    eval_y, _ = jax.vmap(infer, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(
        jnp.moveaxis(xs[0], -1, 1), state)
    stats = state.get(bn.state_index) if isinstance(bn, BatchNorm) else None
    return outs, stats, jnp.moveaxis(eval_y, 1, -1)


XS = [_x((4, 5, 6, 3), seed=i, loc=i) for i in range(3)]


def test_zoo_eqx_batchnorm_equals_flax_in_training_and_eval():
    f_outs, f_stats, f_eval = _flax_bn_steps(XS)
    z_outs, (mean, var), z_eval = _eqx_bn_steps(BatchNorm, XS, momentum=0.9)
    for a, b in zip(f_outs, z_outs, strict=True):
        assert_close(a, b)
    assert_close(mean, f_stats["mean"])
    assert_close(var, f_stats["var"])  # biased variance, as Flax stores
    assert_close(f_eval, z_eval)


def test_zoo_eqx_batchnorm_equals_flax_in_bfloat16():
    """bfloat16 input and parameters: batch statistics in float32, the normalisation in the
    promoted dtype (float32 in training, bfloat16 with bfloat16 stored statistics), as Flax."""
    x = _x((4, 5, 6, 3), loc=2.0).astype(jnp.bfloat16)
    bn = nn.BatchNorm(momentum=0.9, use_fast_variance=False, param_dtype=jnp.bfloat16)
    variables = bn.init(jax.random.key(0), x, use_running_average=False)
    f_train, _ = bn.apply(variables, x, use_running_average=False, mutable=["batch_stats"])
    stats = {"mean": jnp.full((3,), 1.5, jnp.bfloat16), "var": jnp.full((3,), 3.0, jnp.bfloat16)}
    f_eval = bn.apply({**variables, "batch_stats": stats}, x, use_running_average=True)

    zbn, state = eqx.nn.make_with_state(BatchNorm)(3, momentum=0.9, dtype=jnp.bfloat16)
    call = lambda m, s: jax.vmap(m, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(
        jnp.moveaxis(x, -1, 1), s)[0]
    z_train = jnp.moveaxis(call(zbn, state), 1, -1)
    state = state.set(zbn.state_index, (stats["mean"], stats["var"]))
    z_eval = jnp.moveaxis(call(eqx.nn.inference_mode(zbn), state), 1, -1)
    for f, z in ((f_train, z_train), (f_eval, z_eval)):
        assert f.dtype == z.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(f, np.float32), np.asarray(z, np.float32))


def test_equinox_own_batchnorm_modes_differ_from_flax():
    """Why the zoo has its own Equinox BatchNorm: neither mode of eqx.nn.BatchNorm matches."""
    f_outs, _, f_eval = _flax_bn_steps(XS)
    ema_outs, _, _ = _eqx_bn_steps(eqx.nn.BatchNorm, XS, momentum=0.9, mode="ema")
    # tolerance: must differ, by far more than rounding
    assert not np.allclose(ema_outs[1], f_outs[1], atol=1e-3)  # 2nd step uses updated stats
    batch_outs, _, batch_eval = _eqx_bn_steps(eqx.nn.BatchNorm, XS, momentum=0.9, mode="batch")
    assert_close(batch_outs[1], f_outs[1])  # training output agrees
    # tolerance: must differ, by far more than rounding
    assert not np.allclose(batch_eval, f_eval, atol=1e-3)  # inference is debiased


def test_flax_fast_variance_is_inaccurate_on_large_means():
    """The zoo sets use_fast_variance=False: E[x^2]-E[x]^2 fails on large mean, small spread."""
    x = (_x((64, 4, 4, 3)) * 1e-2 + 1e4).astype(jnp.float32)
    exact = np.var(np.asarray(x, np.float64), axis=(0, 1, 2))
    out = {}
    for fast in (True, False):
        bn = nn.BatchNorm(momentum=0.0, use_fast_variance=fast)
        v = bn.init(jax.random.key(0), x, use_running_average=False)
        _, upd = bn.apply(v, x, use_running_average=False, mutable=["batch_stats"])
        out[fast] = np.abs(np.asarray(upd["batch_stats"]["var"]) / exact - 1).max()
    assert out[False] < 1e-2 and out[True] > 0.5, out  # relative errors


def test_momentum_convention_flax_old_weight_torch_new_weight():
    torch = pytest.importorskip("torch")
    bn = torch.nn.BatchNorm2d(3, momentum=0.1)
    x = torch.from_numpy(np.array(jnp.moveaxis(XS[0], -1, 1)))
    bn(x)
    _, f_stats, _ = _flax_bn_steps(XS[:1], momentum=0.9)  # m_flax = 1 - m_torch
    assert_close(bn.running_mean.numpy(), f_stats["mean"])


# ----------------------------------------------------------------------------- dropout
def test_same_raw_key_same_shape_gives_identical_dropout_masks():
    key, x = jax.random.key(3), jnp.ones((4, 16))
    y_eqx = eqx.nn.Dropout(0.5)(x, key=key)
    y_linen = nn.Dropout(0.5, deterministic=False).apply({}, x, rng=key)
    y_nnx = nnx.Dropout(0.5)(x, rngs=key)
    assert np.array_equal(y_eqx, y_linen) and np.array_equal(y_eqx, y_nnx)
    assert 0.2 < float(jnp.mean(y_eqx == 0)) < 0.8
    np.testing.assert_allclose(np.unique(np.asarray(y_eqx)), [0.0, 2.0])  # inverted dropout


@pytest.mark.parametrize("impl", zoo.JAX_IMPLS)
def test_cnn_dropout_is_inverted_keyed_and_off_in_eval(impl):
    config = zoo.tiny_config("cnn", dropout=0.5, batch_norm=False)
    model = zoo.create(config, impl, seed=0)
    api = zoo.interface(impl)
    static, params, state = api.split(model)
    x = api.to_native(zoo.example_input(config, batch=64, seed=1))
    run = jax.jit(lambda k, train: api.apply(static, params, state, x, train=train, key=k)[0],
                  static_argnums=1)
    a, b, c = run(jax.random.key(1), True), run(jax.random.key(1), True), run(jax.random.key(2),
                                                                             True)
    assert np.array_equal(a, b) and not np.allclose(a, c)  # deterministic given the key
    e1, e2 = run(jax.random.key(1), False), run(jax.random.key(2), False)
    assert np.array_equal(e1, e2)  # identity in eval
    # in expectation dropout keeps the hidden units' mean: outputs average out to eval's
    mean = np.mean([np.asarray(run(jax.random.key(k), True)) for k in range(40)], axis=0)
    assert np.abs(mean - np.asarray(e1)).mean() < 0.25 * np.abs(np.asarray(e1)).mean() + 0.05


# ----------------------------------------------------------------------------- kernels
def test_flax_int_kernel_size_is_a_1d_convolution():
    """The trap behind a published 4x 'speed-up': same output shape, a fraction of the work."""
    x = _x((1, 6, 6, 6, 2))
    wrong = nn.Conv(3, kernel_size=3)  # type: ignore[arg-type]
    right = nn.Conv(3, kernel_size=(3, 3, 3))
    vw = wrong.init(jax.random.key(0), x)
    vr = right.init(jax.random.key(0), x)
    assert wrong.apply(vw, x).shape == right.apply(vr, x).shape
    assert vw["params"]["kernel"].ndim == 3 and vr["params"]["kernel"].ndim == 5


@pytest.mark.parametrize(("arch", "impl"), [(a, i) for a in zoo.ARCHS for i in ("linen", "nnx")])
def test_every_flax_conv_kernel_has_rank_spatial_plus_two(arch, impl):
    config = zoo.tiny_config(arch)
    spatial = len(config.input_shape) - 1
    model = zoo.create(config, impl)
    walker = canonical.WALKERS[impl]
    layers = walker.layers(model, example=zoo.registry.abstract_input(config, impl))
    convs = [layer for layer in layers if layer.kind in ("conv", "conv_transpose")]
    for layer, native in walker.read(model, convs).items():
        assert native["kernel"].ndim == spatial + 2, (layer, native["kernel"].shape)


def test_flax_layers_with_int_kernel_size_are_refused_by_the_converters():
    class Bad(nn.Module):
        config: zoo.Config

        @nn.compact
        def __call__(self, x, train=False):
            return nn.Conv(2, kernel_size=3, name="conv1")(x)  # type: ignore[arg-type]

    config = zoo.tiny_config("cnn")
    module = Bad(config)
    variables = module.init(jax.random.key(0), jnp.zeros((1, 10, 9, 2)))
    with pytest.raises(ValueError, match="int kernel_size"):
        converters.to_canonical((module, variables), "linen")


def test_flax_same_padding_differs_from_torch_for_k3_s2_p1_op1():
    """Why the zoo passes explicit padding pairs to Flax conv-transpose."""
    torch = pytest.importorskip("torch")
    layer = torch.nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1)
    x = torch.randn(1, 2, 5, 5)
    y = layer(x).detach().numpy()
    canon = {k: v.detach().numpy() for k, v in layer.state_dict().items()}
    layer = converters.Layer("t", "conv_transpose")
    native = converters.KINDS[layer.kind].convert("flax", canon, layer, to="native")
    xl = np.moveaxis(x.numpy(), 1, -1)
    same = nn.ConvTranspose(3, (3, 3), strides=(2, 2), padding="SAME")
    explicit = nn.ConvTranspose(3, (3, 3), strides=(2, 2), padding=((1, 2), (1, 2)))
    y_same = np.moveaxis(np.asarray(same.apply({"params": native}, xl)), -1, 1)
    y_explicit = np.moveaxis(np.asarray(explicit.apply({"params": native}, xl)), -1, 1)
    # tolerance: must differ, by far more than rounding
    assert y_same.shape == y.shape and not np.allclose(y_same, y, atol=1e-3)
    assert_close(y_explicit, y)


def test_gelu_is_the_exact_erf_form_as_in_torch():
    torch = pytest.importorskip("torch")
    x = np.linspace(-4, 4, 101, dtype=np.float32)
    from zoo.models.common import activation

    expected = torch.nn.GELU()(torch.from_numpy(x)).numpy()
    assert_close(activation("gelu")(jnp.asarray(x)), expected)
