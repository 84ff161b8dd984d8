"""Layer matching (`converters.matching.match`) on its own: evidence order, natural order of
numbered names, and properties of random renamings (no models run: shapes only)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import zoo
from converters.matching import MatchError, TargetLayer, from_flat, match
from tests.conftest import examples
from zoo.registry import schema


def targets_of(config: zoo.Config) -> list[TargetLayer]:
    found, spec = schema(config)
    return [TargetLayer.of(layer, {k: tuple(v.shape) for k, v in spec.items()})
            for layer in found]


def renamed_state(targets: list[TargetLayer], names: dict[str, str]) -> dict[str, np.ndarray]:
    """A torch-family flat state whose layer `t.name` is called `names[t.name]`."""
    return {f"{names[t.name]}.{k}" if k else names[t.name]: np.zeros(s, np.float32)
            for t in targets for k, s in t.shapes.items()}


def distinct_shapes(targets: list[TargetLayer]) -> bool:
    keys = [(t.kind, tuple(sorted(t.shapes.items()))) for t in targets]
    return len(set(keys)) == len(keys)


NAMES = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8).map(lambda s: "x" + s)
DISTINCT = [zoo.tiny_config(a) for a in zoo.ARCHS]


@settings(max_examples=examples(25), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(arch=st.sampled_from(range(len(DISTINCT))), data=st.data())
def test_random_renamings_with_distinct_shapes_match_back(arch, data):
    targets = targets_of(DISTINCT[arch])
    assume(distinct_shapes(targets))
    names = data.draw(st.lists(NAMES, min_size=len(targets), max_size=len(targets),
                               unique=True))
    mapping = dict(zip((t.name for t in targets), names, strict=True))
    flat = renamed_state(targets, mapping)
    keys = data.draw(st.permutations(list(flat)))
    sources = from_flat({k: flat[k] for k in keys}, "torch", ordered=False)
    rows = match(sources, targets)
    back = {v: k for k, v in mapping.items()}
    assert {r.source: r.target for r in rows} == back
    assert {r.rule for r in rows} == {"shape"}


SQUARE = zoo.make_config("mlp", in_features=8, hidden=(8, 8), out_features=3)


@settings(max_examples=examples(25), deadline=None, derandomize=True, database=None)
@given(names=st.lists(NAMES | st.integers(0, 99).map(lambda i: f"w{i}"), min_size=3,
                      max_size=3, unique=True), order=st.permutations(range(3)))
def test_same_shaped_layers_are_refused_or_flagged(names, order):
    """Two layers of one shape: never paired by a guess. Without order evidence (sorted keys,
    names that number nothing) the match is refused; with it, the rows say "order"."""
    targets = targets_of(SQUARE)
    twins = {t.name for t in targets if t.shapes["weight"] == (8, 8)}
    assert len(twins) == 2
    mapping = dict(zip((t.name for t in targets), names, strict=True))
    flat = renamed_state(targets, mapping)
    keys = [k for i in order for k in flat if k.startswith(names[i] + ".")]
    sources = from_flat({k: flat[k] for k in keys}, "torch", ordered=False)
    try:
        rows = match(sources, targets)
    except MatchError as e:
        assert "ambiguous" in str(e) and "--map" in str(e)
        return
    assert all(r.rule == "order" for r in rows if r.target in twins)
    assert all(r.target not in twins for r in rows if r.rule == "shape")


def test_natural_order_and_ordered_sources():
    targets = targets_of(SQUARE)
    flat = renamed_state(targets, {t.name: f"Dense_{i}" for i, t in
                                   enumerate(targets)})
    rows = match(from_flat(flat, "torch", ordered=False), targets)
    assert [(r.source, r.target) for r in rows] == [(f"Dense_{i}", t.name)
                                                    for i, t in enumerate(targets)]
    # Dense_10 sorts after Dense_2 (orbax stores keys sorted as text)
    many = {f"Dense_{i}.weight": np.zeros((2, 2)) for i in (10, 2, 1)}
    assert [s.key for s in from_flat(many, "torch", ordered=False)] == [
        "Dense_1", "Dense_2", "Dense_10"]
    # a torch state_dict keeps definition order: names without numbers pair in that order
    named = renamed_state(targets, dict(zip((t.name for t in targets),
                                            ("first", "second", "head"), strict=True)))
    rows = match(from_flat(named, "torch", ordered=True), targets, ordered=True)
    assert [r.target for r in rows] == [t.name for t in targets]
    assert [r.rule for r in rows] == ["order", "order", "shape"]


def test_flax_trees_and_unknown_arrays():
    targets = targets_of(zoo.tiny_config("mlp"))
    tree = {f"params.Dense_{i}.{k}": np.zeros(s[::-1] if k == "weight" else s, np.float32)
            for i, t in enumerate(targets) for k, s in t.shapes.items()}
    tree = {k.replace(".weight", ".kernel"): v for k, v in tree.items()}
    rows = match(from_flat(tree, "flax", ordered=False), targets)
    assert [r.target for r in rows] == [t.name for t in targets]
    odd = {"a.gamma": np.zeros(3), "a.beta": np.zeros(3)}
    with pytest.raises(MatchError, match="no layer kind holds"):
        match(from_flat(odd, "torch", ordered=True), targets)


def _flax_example_tree(block_cls, stages: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The Flax ImageNet example's variables as a flat tree of zeros (shapes only)."""
    import jax
    import jax.numpy as jnp

    from tests.flax_imagenet import ResNet

    module = ResNet(stage_sizes=stages, block_cls=block_cls, num_classes=10, num_filters=8)
    abstract = jax.eval_shape(lambda k: module.init(k, jnp.zeros((1, 32, 32, 3)), train=False),
                              jax.random.key(0))
    flat, _ = jax.tree_util.tree_flatten_with_path(abstract)
    return {".".join(str(p.key) for p in path): np.zeros(a.shape, a.dtype) for path, a in flat}


def _example_names(config: zoo.Config, block: str) -> dict[str, str]:
    """The example's layer names -> the zoo's, as the example's code defines them: blocks
    numbered in call order, `Conv_k` / `BatchNorm_k` the block's (k+1)-th, the projection
    `conv_proj` / `norm_proj`, the stem `conv_init` / `bn_init`, the head `Dense_0`."""
    names = {"conv_init": "conv1", "bn_init": "bn1", "Dense_0": "fc"}
    blocks = [(i, j) for i, n in enumerate(config.layers) for j in range(n)]
    for b, (i, j) in enumerate(blocks):
        scope, target = f"{block}_{b}", f"layer{i + 1}.{j}"
        for k in range(3 if block.startswith("Bottleneck") else 2):
            names[f"{scope}.Conv_{k}"] = f"{target}.conv{k + 1}"
            names[f"{scope}.BatchNorm_{k}"] = f"{target}.bn{k + 1}"
        if config.stages()[i][j].downsample:
            names[f"{scope}.conv_proj"] = f"{target}.downsample.0"
            names[f"{scope}.norm_proj"] = f"{target}.downsample.1"
    return names


@pytest.mark.parametrize(("block", "stages"), [("basic", (2, 2, 2, 2)),
                                               ("bottleneck", (3, 4, 6, 3))])
def test_nesting_pairs_the_flax_imagenet_example(block, stages):
    """Explicit names among auto names (`bn_init` sorts after `ResNetBlock_*`): the scopes and
    the numbers in them decide every pair; nothing is left to sorted names."""
    from tests.flax_imagenet import BottleneckResNetBlock, ResNetBlock

    cls = ResNetBlock if block == "basic" else BottleneckResNetBlock
    config = zoo.make_config("resnet", block=block, layers=stages, widths=(8, 16, 32, 64),
                             stem_width=8, input_size=(32, 32), num_classes=10)
    sources = from_flat(_flax_example_tree(cls, stages), "flax", ordered=False)
    rows = match(sources, targets_of(config))
    assert {r.source: r.target for r in rows} == _example_names(config, cls.__name__)
    assert {r.rule for r in rows} == {"shape", "nesting"}


def test_suggestions_name_candidates_never_sorted_pairs():
    """Two same-shaped layers whose names order nothing: the refusal names both candidates
    and suggests no pairing (sorted names would pair `aa_second` with `layers.0`)."""
    targets = targets_of(SQUARE)
    flat = renamed_state(targets, dict(zip((t.name for t in targets),
                                           ("zz_first", "aa_second", "head"), strict=True)))
    with pytest.raises(MatchError) as e:
        match(from_flat(flat, "torch", ordered=False), targets)
    text = str(e.value)
    assert "undecided: ['aa_second', 'zz_first'] fit ['layers.0', 'layers.1'] alike" in text
    assert not re.search(r"--map '(aa_second|zz_first)=layers", text)


def test_nesting_never_orders_scopes_by_their_names():
    """Two blocks of the same shapes whose names number nothing (`beta`, `alpha` for the
    first two blocks): no evidence orders them, so their layers are refused, not guessed."""
    from tests.flax_imagenet import ResNetBlock

    config = zoo.make_config("resnet", widths=(8, 16, 32, 64), stem_width=8,
                             input_size=(32, 32), num_classes=10)
    names = {"ResNetBlock_0": "beta", "ResNetBlock_1": "alpha"}
    tree = {".".join(names.get(p, p) for p in k.split(".")): v
            for k, v in _flax_example_tree(ResNetBlock, (2, 2, 2, 2)).items()}
    with pytest.raises(MatchError, match="ambiguous") as e:
        match(from_flat(tree, "flax", ordered=False), targets_of(config))
    paired = {r.source: r.target for r in e.value.rows if r.rule}
    assert not any(k.startswith(("alpha.", "beta.")) for k in paired)
    assert paired["ResNetBlock_2.norm_proj"] == "layer2.0.downsample.1"
