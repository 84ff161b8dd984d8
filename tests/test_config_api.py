"""Configs as users meet them: unknown keys, wrong input shapes, nested values through JSON."""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zoo
from tests.conftest import examples
from zoo.configs import Config, ConfigError, config_from_dict

_PAIRS = zoo.list_implementations()


def test_an_unknown_key_gives_the_clis_error_in_python():
    """`zoo.create` and `make_config` refuse a misspelt key as the CLI's JSON path does: the
    same ConfigError, the same text, listing the valid keys."""
    with pytest.raises(ConfigError) as from_json:
        config_from_dict({"arch": "cnn", "featurs": [8]})
    for call in (lambda: zoo.create("cnn", "nnx", featurs=(8,)),
                 lambda: zoo.make_config("cnn", featurs=(8,)),
                 lambda: zoo.tiny_config("cnn", featurs=(8,))):
        with pytest.raises(ConfigError) as from_python:
            call()
        assert str(from_python.value) == str(from_json.value)
    assert "unknown cnn config keys ['featurs']; valid keys: [" in str(from_json.value)
    assert "'features'" in str(from_json.value)


def _wrong_sample(cfg: zoo.Config) -> tuple[int, ...]:
    """A sample shape `cfg.input_axes` refuse: a fixed axis one longer, else a free one
    shorter than its minimum or longer than its maximum (empty, when it has neither: a token
    sequence)."""
    shape = list(cfg.input_shape)
    axes = cfg.input_axes
    i = next((i for i, a in enumerate(axes) if a.size is not None), None)
    if i is not None:
        shape[i] += 1
        return tuple(shape)
    i, a = next(((i, a) for i, a in enumerate(axes) if a.minimum > 1 or a.maximum is not None),
                (0, axes[0]))
    shape[i] = a.minimum - 1 if a.minimum > 1 or a.maximum is None else a.maximum + 1
    return tuple(shape)


def _contract(cfg: zoo.Config) -> str:
    """How the refusal shows the contract: fixed sizes as numbers, free axes by name."""
    return "(" + ", ".join(a.symbol for a in cfg.input_axes) + ")"


@pytest.mark.parametrize(("arch", "impl"), _PAIRS, ids=[f"{a}-{i}" for a, i in _PAIRS])
def test_a_wrong_input_size_names_the_expected_shape(arch: str, impl: str):
    """Every model checks its input against its config's `input_axes` when traced and names
    the contract and the shape, channels-first in every library."""
    cfg = zoo.tiny_config(arch)
    wrong = _wrong_sample(cfg)
    message = rf"^{arch} expects {_escaped(_contract(cfg))} per sample.*, got {_escaped(wrong)}"
    x = np.zeros((2, *wrong), np.dtype(cfg.INPUT_DTYPE))
    model = zoo.skeleton(cfg, impl)  # the check runs when traced: no weights are computed
    if impl == "torch":
        import torch

        with pytest.raises(ConfigError, match=message):
            model.eval()(torch.from_numpy(x))
        return
    api = zoo.interface(impl)
    static, params, state = api.split(model)
    with pytest.raises(ConfigError, match=message):
        jax.eval_shape(lambda p, s, v: api.apply(static, p, s, v), params, state,
                       api.to_native(x, cfg))


def _escaped(shape: tuple[int, ...]) -> str:
    return str(shape).replace("(", r"\(").replace(")", r"\)")


def test_check_input_layouts():
    """Channels-last shapes are reported channels-first; a wrong rank shows the layout."""
    cfg = zoo.make_config("cnn")
    cfg.check_input((4, 1, 28, 28))
    cfg.check_input((28, 28, 1), channels_last=True, batched=False)
    with pytest.raises(ConfigError, match=r"^cnn expects \(1, 28, 28\) per sample, "
                                          r"got \(1, 32, 32\)$"):
        cfg.check_input((4, 32, 32, 1), channels_last=True)
    with pytest.raises(ConfigError, match=r"^cnn expects batched inputs shaped "
                                          r"\(N, 28, 28, 1\), got \(28, 28, 1\)$"):
        cfg.check_input((28, 28, 1), channels_last=True)
    with pytest.raises(ConfigError, match=r"per-sample inputs shaped \(1, 28, 28\)"):
        cfg.check_input((4, 1, 28, 28), batched=False)


def test_free_axes_are_named_with_their_rule():
    """An architecture that pools globally takes any size its rules allow, and a refusal
    names the rule it breaks in one line."""
    cfg = zoo.make_config("resnet18")
    for shape in ((2, 3, 1, 1), (2, 3, 64, 48), (2, 3, 225, 224)):
        cfg.check_input(shape)
    cfg.check_input((2, 64, 48, 3), channels_last=True)
    with pytest.raises(ConfigError, match=r"^resnet expects \(3, H, W\) per sample \(H >= 1; "
                                          r"W >= 1\), got \(1, 64, 64\): C must be 3, not 1$"):
        cfg.check_input((2, 64, 64, 1), channels_last=True)


def test_axis_rules():
    """`Axis`: an exact size, or a minimum, a maximum and a multiple; each refusal says which."""
    from zoo.configs import Axis

    assert Axis("C", size=3).problem(3) is None
    assert Axis("C", size=3).problem(4) == "C must be 3, not 4"
    axis = Axis("H", minimum=32, multiple=32)
    assert axis.problem(64) is None
    assert axis.problem(16) == "H >= 32, not 16"
    assert axis.problem(48) == "H must be a multiple of 32, not 48"
    length = Axis("L", maximum=1024)
    assert length.problem(1024) is None and length.describe() == "1 <= L <= 1024"
    assert length.problem(1025) == "1 <= L <= 1024, not 1025"


# --------------------------------------------------------------------------- nested values
@dataclass(frozen=True)
class StagesConfig(Config):
    """A config with a nested tuple field (not registered)."""

    arch: ClassVar[str] = "stages"
    stages: tuple[tuple[int, ...], ...] = ((64,), (128, 128))
    pairs: tuple[tuple[int, int], ...] = ((1, 2),)
    mode: Literal["a", "b"] = "a"


def test_a_nested_tuple_config_round_trips_through_json():
    cfg = StagesConfig(stages=((4,), (8, 8), ()), pairs=((3, 4), (5, 6)))
    back = StagesConfig.from_dict(json.loads(cfg.to_json()))
    assert back == cfg and hash(back) == hash(cfg)
    assert isinstance(back.stages[1], tuple)
    with pytest.raises(ConfigError, match=r"StagesConfig.stages: expected a list, each item a "
                                          r"list, each item an integer, found \(\(1, 'x'\),\)"):
        StagesConfig.from_dict({"stages": [[1, "x"]]})
    with pytest.raises(ConfigError, match=r"StagesConfig.pairs"):
        StagesConfig.from_dict({"pairs": [[1, 2, 3]]})


def _strategy(hint: Any) -> st.SearchStrategy:
    """Values of a config field's type (any depth of tuples)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return st.none()
    if origin in (typing.Union, types.UnionType):  # `bool | None`: any of the members
        return st.one_of(*map(_strategy, args))
    if origin is Literal:
        return st.sampled_from(args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(_strategy(args[0]), max_size=4).map(tuple)
        return st.tuples(*map(_strategy, args))
    return {int: st.integers(-2**31, 2**31), bool: st.booleans(), str: st.text(max_size=8),
            float: st.floats(allow_nan=False, allow_infinity=False)}[hint]


# Each distinct type hint of a registered config field (and StagesConfig's), named by the first
# field that has it: fields sharing a hint share the code path, so one case covers them all.
_HINTS: dict[Any, str] = {}
for _cls in (*(zoo.architecture(a).config for a in zoo.ARCHS), StagesConfig):
    for _field in dataclasses.fields(_cls):
        _HINTS.setdefault(typing.get_type_hints(_cls)[_field.name], f"{_cls.arch}.{_field.name}")


@functools.cache
def _probe(hint: Any) -> type[Config]:
    """A config class with one field, `value`, of type `hint`."""
    return dataclasses.make_dataclass("Probe", [("value", hint)], bases=(Config,), frozen=True,
                                      namespace={"arch": "probe"})


@pytest.mark.parametrize("hint", _HINTS, ids=_HINTS.values())
@settings(max_examples=examples(25), deadline=None)
@given(data=st.data())
def test_every_config_field_type_survives_json(hint: Any, data: Any):
    """Any value of any registered config field's type comes back through JSON and
    `Config.from_dict` equal, with the field's type (lists become tuples at every depth)."""
    cls = _probe(hint)
    value = data.draw(_strategy(hint))
    back = cls.from_dict(json.loads(cls(value=value).to_json())).value
    assert back == value
    assert type(back) is type(value)


@pytest.mark.parametrize("arch", list(zoo.ARCHS))
def test_every_declared_config_round_trips(arch: str):
    """Defaults, TINY, variants and named configs of every architecture survive JSON."""
    cls = zoo.architecture(arch).config
    configs = [cls(), cls.tiny(), *(cls.tiny(**v) for v in cls.VARIANTS.values()),
               *(cls.named(n) for n in cls.NAMED)]
    for cfg in configs:
        assert config_from_dict(json.loads(cfg.to_json())) == cfg

