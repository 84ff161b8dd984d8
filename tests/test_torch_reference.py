"""The PyTorch reference agrees with every JAX implementation: forward and gradients."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import converters
import zoo
from canonical.torch_arrays import torch_to_numpy
from tests.conftest import CASE_IDS, CASES
from tests.kind_cover import cover, latin
from zoo.testing import assert_close

torch = pytest.importorskip("torch")
CONFIGS = dict(CASES)


@functools.cache
def _torch_results(case: str, train: bool):
    """Output, input gradient and canonical parameter gradients of <y, cotangent> in PyTorch."""
    config = CONFIGS[case]
    model = zoo.create(config, "torch", seed=3).train(train)
    counts = {}  # values per channel seen by each BatchNorm (for the unbiased variance)
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.register_forward_hook(lambda m, inp, out, name=name: counts.__setitem__(
                name, inp[0].numel() // inp[0].shape[1]))
    x = torch.from_numpy(np.array(zoo.example_input(config, batch=3, seed=2)))
    if x.is_floating_point():  # integer inputs (tokens) have no gradient
        x.requires_grad_()
    y = model(x)
    cotangent = torch.from_numpy(np.array(jax.random.normal(jax.random.key(7), y.shape)))
    (y * cotangent).sum().backward()
    grads = {k: torch_to_numpy(p.grad) for k, p in model.named_parameters()}
    stats = {k: torch_to_numpy(v) for k, v in model.state_dict().items() if "running" in k}
    gx = None if x.grad is None else torch_to_numpy(x.grad)
    return torch_to_numpy(y), gx, grads, stats, counts, cotangent.numpy()


# Every case in both modes, each in another JAX library, the libraries turning between cases
# (they agree with each other on every case: tests/test_equivalence.py); --exhaustive: every
# case in both modes in every library.
@pytest.mark.parametrize(("case", "impl", "train"), cover(CASE_IDS, latin(
    zoo.JAX_IMPLS, [pytest.param(False, id="eval"), pytest.param(True, id="train")]),
    per_case=2))
def test_jax_matches_torch(case, impl, train):
    y_t, gx_t, gp_t, stats_t, counts, cotangent = _torch_results(case, train)
    config = CONFIGS[case]
    model = converters.convert(zoo.create(config, "torch", seed=3), "torch", impl)
    api = zoo.interface(impl)
    static, params, state = api.split(model)
    x = zoo.example_input(config, batch=3, seed=2)

    def loss(params, x):
        y, new_state = api.apply(static, params, state, api.to_native(x, config), train=train)
        y = api.to_canonical(y, config)
        return jnp.sum(y * cotangent), (y, new_state)

    argnums = (0, 1) if gx_t is not None else 0  # token ids have no gradient
    (_, (y, new_state)), grads = jax.jit(
        jax.value_and_grad(loss, argnums=argnums, has_aux=True))(params, x)
    gp = grads[0] if gx_t is not None else grads
    assert_close(np.asarray(y), y_t)
    if gx_t is not None:
        assert_close(np.asarray(grads[1]), gx_t)
    grads = converters.to_canonical(api.merge(static, gp, state), impl)
    assert_close({k: np.asarray(grads[k]) for k in gp_t}, gp_t)
    if train and stats_t:
        _check_running_stats(converters.to_canonical(api.merge(static, params, new_state), impl),
                             stats_t, counts, config.bn_momentum)


def _check_running_stats(jax_state, torch_stats, counts, m):
    """Means agree; PyTorch stores the unbiased variance (x n/(n-1)), the JAX libraries the
    biased one, so after one step from var=1: (r_torch - m) = (r_jax - m) * n / (n - 1)."""
    for key, value in torch_stats.items():
        if key.endswith("running_mean"):
            assert_close(np.asarray(jax_state[key]), value)
        else:
            n = counts[key.rsplit(".", 1)[0]]
            unbiased = (np.asarray(jax_state[key]) - m) * n / (n - 1) + m
            assert_close(unbiased, value)
            # tolerance: must differ, by far more than rounding
            assert not np.allclose(np.asarray(jax_state[key]), value, rtol=1e-6, atol=1e-7)
