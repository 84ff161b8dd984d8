"""Drop path (stochastic depth) in the four libraries: timm's `drop_path` semantics.

The identity in evaluation and at rate 0; in training one Bernoulli keep per sample, a kept
sample scaled by 1 / keep. The same raw key draws bitwise the same mask in Equinox (per sample,
under `vmap` with `split(key, N)`, as `zoo.interface("eqx").apply` hands out keys), Linen and
NNX; PyTorch given that mask (`DropPath.keep`) computes the same outputs and gradients, and
drawing its own it equals timm's `drop_path` under the same seed. The keep rate is checked
statistically on a seeded batch.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import zoo
from zoo.layers.drop_path import block_keys, keep_mask
from zoo.layers.eqx import EqxDropPath
from zoo.layers.linen import LinenDropPath
from zoo.layers.nnx import NNXDropPath

torch = pytest.importorskip("torch")
from zoo.layers.torch import DropPath  # noqa: E402  (needs torch)

RATE = 0.3
KEY = jax.random.key(42)


def _x(n: int = 8) -> np.ndarray:
    """A canonical (N, C, H, W) batch."""
    return np.random.default_rng(0).standard_normal((n, 3, 4, 5)).astype(np.float32)


def _nhwc(x):
    return jnp.transpose(x, (0, 2, 3, 1))


def _nchw(y):
    return np.asarray(jnp.transpose(y, (0, 3, 1, 2)))


def run(impl: str, x: np.ndarray, *, train: bool, key=None, rate: float = RATE,
        keep=None) -> np.ndarray:
    """The layer of `impl` on the canonical batch `x`; canonical output."""
    if impl == "eqx":
        layer = EqxDropPath(rate)
        if not train:
            layer = eqx.nn.inference_mode(layer)
        api = zoo.interface("eqx")  # per sample, one key each: split(key, N)
        static, params, state = api.split(layer)
        return np.asarray(api.apply(static, params, state, jnp.asarray(x), train=train,
                                    key=key)[0])
    if impl == "linen":
        y = LinenDropPath(rate).apply({}, _nhwc(x), deterministic=not train, key=key)
        return _nchw(y)
    if impl == "nnx":
        layer = NNXDropPath(rate)
        layer.train() if train else layer.eval()
        return _nchw(layer(_nhwc(x), rngs=key))
    layer = DropPath(rate).train(train)
    if keep is not None:
        layer.keep = torch.from_numpy(np.array(keep))
    return layer(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_identity_in_eval_and_at_rate_zero(impl):
    x = _x()
    np.testing.assert_array_equal(run(impl, x, train=False, key=KEY), x)
    np.testing.assert_array_equal(run(impl, x, train=True, key=KEY, rate=0.0), x)


def test_one_key_gives_one_mask_in_every_library():
    """Equinox (per sample, through its interface), Linen and NNX draw the same mask from the
    same key, bitwise; PyTorch given that mask computes the same outputs."""
    x = _x(16)
    keep = np.asarray(keep_mask(KEY, 16, RATE))
    assert 0 < keep.sum() < 16, "a mask keeping all or none proves little"
    want = x * (keep.astype(np.float32) / np.float32(1 - RATE))[:, None, None, None]
    outs = {impl: run(impl, x, train=True, key=KEY, keep=keep) for impl in zoo.IMPLS}
    for impl, y in outs.items():
        np.testing.assert_array_equal(y, want, err_msg=impl)


def test_one_key_per_sample_is_what_an_equinox_model_draws_per_block():
    """A batched layer given one key per sample (`block_keys` of the samples' keys) draws what
    the Equinox layer draws from each sample's key folded with the block's index."""
    x, index = _x(12), 5
    samples = jax.random.split(KEY, 12)
    per_block = block_keys(samples, index)
    eqx_layer = EqxDropPath(RATE)
    want = np.asarray(jax.vmap(lambda xi, ki: eqx_layer(xi, key=block_keys(ki, index)))(
        jnp.asarray(x), samples))
    got_linen = _nchw(LinenDropPath(RATE).apply({}, _nhwc(x), deterministic=False,
                                                key=per_block))
    got_nnx = _nchw(NNXDropPath(RATE)(_nhwc(x), rngs=per_block))
    np.testing.assert_array_equal(got_linen, want)
    np.testing.assert_array_equal(got_nnx, want)
    assert not np.array_equal(want, run("linen", x, train=True, key=KEY)), \
        "the per-sample keys should draw another mask than the batch key"


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_keep_rate_and_scale(impl):
    """On 4000 seeded samples the kept share is 1 - rate within 5 standard deviations; kept
    samples are scaled by exactly 1 / keep, dropped ones are zero."""
    n = 4000
    x = np.ones((n, 1, 1, 2), np.float32)
    torch.manual_seed(0)
    y = run(impl, x, train=True, key=jax.random.key(7))
    kept = y[:, 0, 0, 0] != 0
    share, sigma = kept.mean(), np.sqrt(RATE * (1 - RATE) / n)
    assert abs(share - (1 - RATE)) < 5 * sigma, (impl, share)
    np.testing.assert_array_equal(y[kept], np.float32(1) / np.float32(1 - RATE))
    np.testing.assert_array_equal(y[~kept], 0)
    assert (y[:, :, :, 0] == y[:, :, :, 1]).all(), "one draw per sample"


def test_gradients_given_the_same_mask():
    """d<y, c>/dx = c * keep / (1 - rate) in every library."""
    x = _x(10)
    c = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    keep = np.asarray(keep_mask(KEY, 10, RATE))
    want = c * (keep.astype(np.float32) / np.float32(1 - RATE))[:, None, None, None]
    eqx_layer = EqxDropPath(RATE)
    grads = {
        "eqx": jax.grad(lambda v: jnp.sum(c * jax.vmap(lambda xi, ki: eqx_layer(xi, key=ki))(
            v, jax.random.split(KEY, 10))))(jnp.asarray(x)),
        "linen": jax.grad(lambda v: jnp.sum(_nhwc(c) * LinenDropPath(RATE).apply(
            {}, _nhwc(v), deterministic=False, key=KEY)))(jnp.asarray(x)),
        "nnx": jax.grad(lambda v: jnp.sum(_nhwc(c) * NNXDropPath(RATE)(
            _nhwc(v), rngs=KEY)))(jnp.asarray(x))}
    xt = torch.from_numpy(x).requires_grad_()
    layer = DropPath(RATE).train()
    layer.keep = torch.from_numpy(keep.copy())
    (layer(xt) * torch.from_numpy(c)).sum().backward()
    grads["torch"] = xt.grad.numpy()
    for impl, g in grads.items():
        # tolerance: one product per element, no reduction: a few ulps of each value
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-6, atol=0, err_msg=impl)


def test_torch_draws_as_timm_under_the_same_seed():
    timm_drop = pytest.importorskip("timm.layers").drop_path
    x = torch.from_numpy(_x(64))
    torch.manual_seed(3)
    ours = DropPath(RATE).train()(x)
    torch.manual_seed(3)
    theirs = timm_drop(x, RATE, training=True)
    assert torch.equal(ours, theirs)


def test_training_without_randomness_or_with_a_bad_rate_is_refused():
    x = _x(2)
    with pytest.raises(RuntimeError, match="needs a key in training"):
        EqxDropPath(RATE)(jnp.asarray(x[0]))
    with pytest.raises(RuntimeError, match="needs rngs in training"):
        NNXDropPath(RATE)(_nhwc(x))
    with pytest.raises(Exception, match="dropout"):  # Linen: no "dropout" stream given
        LinenDropPath(RATE).apply({}, _nhwc(x), deterministic=False)
    with pytest.raises(ValueError, match="keys of shape"):
        keep_mask(jax.random.split(KEY, 3), 2, RATE)
    for bad in (-0.1, 1.0):
        for make in (EqxDropPath, NNXDropPath, DropPath):
            with pytest.raises(ValueError, match=r"rate must be in \[0, 1\)"):
                make(bad)
    layer = DropPath(RATE).train()
    layer.keep = torch.ones(3)
    with pytest.raises(ValueError, match=r"3 values \(shape \(3,\)\) for a batch of 2"):
        layer(torch.from_numpy(x))
    # NNX streams work too: an Rngs at construction, advanced at every call.
    layer = NNXDropPath(RATE, rngs=nnx.Rngs(dropout=0))
    a, b = layer(_nhwc(_x(32))), layer(_nhwc(_x(32)))
    assert not np.array_equal(np.asarray(a), np.asarray(b))
