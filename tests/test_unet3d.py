"""3-D U-Net: the config's refusals, and the skip-concatenation order as a conversion contract."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import converters
import zoo
from zoo.models.unet3d.config import CONCAT_ORDER


@pytest.mark.parametrize(("overrides", "match"), [
    ({"input_size": (4, 6, 3)}, r"input_size \(4, 6, 3\) must be a multiple of 2\^depth = 2"),
    ({"widths": (2, 4, 8), "input_size": (4, 6, 4)}, "multiple of 2\\^depth = 4"),
    ({"widths": (4,)}, "widths needs at least 2 entries"),
    ({"norm": "group", "groups": 3}, "groups 3 must divide every width"),
    ({"up_kernel_size": 3}, "not to the skip's"),
    ({"up_output_padding": 2}, "up-sampling: output_padding"),
    ({"down": "avgpool"}, "UNet3DConfig.down"),
    ({"conv_method": "fft"}, "conv_method"),
    ({"norm_eps": 0.0}, "norm_eps"),
])
def test_bad_configs_are_refused_in_one_line(overrides, match):
    with pytest.raises(zoo.ConfigError, match=match) as info:
        zoo.tiny_config("unet3d", **overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("up", [dict(up_kernel_size=3, up_padding=1, up_output_padding=1),
                                dict(up_kernel_size=4, up_padding=1)])
def test_other_pytorch_up_sampling_hyper_parameters_are_accepted(up):
    config = zoo.tiny_config("unet3d", **up)
    assert [s.output_size for s in config.conv_transposes()] == [(4, 6, 2)]


@functools.cache
def _forward(impl: str):
    """Jitted eval forward of the tiny U-Net from a canonical state (one compilation)."""
    config = zoo.tiny_config("unet3d")
    if impl == "torch":
        torch = pytest.importorskip("torch")

        def run(state, x):
            model = converters.from_canonical(state, config, "torch").eval()
            with torch.no_grad():
                return model(torch.from_numpy(np.array(x))).numpy()
        return run
    api = zoo.interface(impl)
    static, _, _ = api.split(zoo.create(config, impl))
    apply = jax.jit(lambda p, s, x: api.apply(static, p, s, x)[0])

    def run(state, x):
        _, params, stats = api.split(converters.from_canonical(state, config, impl))
        return np.asarray(api.to_canonical(apply(params, stats, api.to_native(x))))
    return run


@pytest.mark.parametrize("impl", zoo.IMPLS)
def test_decoder_reads_the_skip_first(impl):
    """`decoders.0.conv1` reads cat([skip, up]) (CONCAT_ORDER): with the weights of its `up`
    input channels zeroed, `ups.0` no longer reaches the output; with those of its `skip`
    channels zeroed, it does. The same in every library, so the order is part of the format."""
    assert CONCAT_ORDER == ("skip", "up")
    config = zoo.tiny_config("unet3d")
    base = zoo.canonical_init(config, seed=1)
    c = config.decoder_widths()[0]
    x = np.asarray(zoo.example_input(config, batch=2, seed=3))
    run = _forward(impl)
    for zeroed, reaches in (("up", False), ("skip", True)):
        state = dict(base)
        w = state["decoders.0.conv1.weight"].copy()
        w[:, slice(c, None) if zeroed == "up" else slice(0, c)] = 0
        state["decoders.0.conv1.weight"] = w
        other = dict(state, **{"ups.0.weight": state["ups.0.weight"] * 3 + 1})
        # tolerance: whether a weight reaches the output at all: a change far above rounding
        changed = not np.allclose(run(state, x), run(other, x), atol=1e-6)
        assert changed == reaches, (impl, zeroed)
