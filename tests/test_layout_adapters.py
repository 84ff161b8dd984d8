"""The layout adapters' mechanism (`converters.adapters.adapter`), one declaration per layout for
both directions: renames with value changes (`Transform`), fuses, unequal splits, left-out keys
(`Drop`, with the reason), index offsets (`{i+1}`), stripped prefixes and scanned (stacked)
layers; read-only value changes refuse to write; refusals name the keys."""

from __future__ import annotations

import numpy as np
import pytest

from converters import adapters
from converters.adapters.adapter import (
    HEADS_IN,
    TRANSPOSE,
    Adapter,
    AdapterError,
    Drop,
    Fuse,
    Rename,
    Split,
    Stack,
    reshape,
)

RNG = np.random.default_rng(0)

TOY = Adapter(
    name="toy", description="a toy layout", arch="vit", prefix="model.", strip=("params/",),
    renames=(Rename("model.cls", "cls_token", reshape((1, 1, -1), (-1,))),
             Rename("model.dense.kernel", "head.weight", TRANSPOSE),
             Rename("model.stage{i}.down.{p}", "layers.{i+1}.downsample.{p}")),
    fuses=(Fuse(("model.b{i}.q.{p}", "model.b{i}.k.{p}", "model.b{i}.v.{p}"),
                "blocks.{i}.attn.qkv.{p}", "query, key and value"),),
    splits=(Split("model.pool.in_proj", ("pool.q.weight", "pool.kv.weight"), (1, 2)),),
    drops=(Drop("model.b{i}.index", "a derived buffer"), Drop("txt/{r}", "the text tower")))


def _toy_state() -> dict[str, np.ndarray]:
    return {"model.cls": RNG.standard_normal(4), "model.dense.kernel": RNG.standard_normal((4, 3)),
            "model.stage0.down.weight": RNG.standard_normal(2),
            **{f"model.b0.{n}.weight": RNG.standard_normal((4, 4)) for n in "qkv"},
            "model.pool.in_proj": RNG.standard_normal((6, 4)), "model.b0.index": np.arange(3),
            "txt/encoder/w": np.zeros(2)}


def test_rules_map_both_ways():
    state = _toy_state()
    zoo = TOY.to_zoo(state)
    assert sorted(zoo) == ["blocks.0.attn.qkv.weight", "cls_token", "head.weight",
                           "layers.1.downsample.weight", "pool.kv.weight", "pool.q.weight"]
    assert zoo["cls_token"].shape == (1, 1, 4)
    np.testing.assert_array_equal(zoo["head.weight"], state["model.dense.kernel"].T)
    np.testing.assert_array_equal(zoo["pool.q.weight"], state["model.pool.in_proj"][:2])
    np.testing.assert_array_equal(zoo["pool.kv.weight"], state["model.pool.in_proj"][2:])
    np.testing.assert_array_equal(zoo["blocks.0.attn.qkv.weight"][4:8],
                                  state["model.b0.k.weight"])
    back = TOY.from_zoo(zoo)
    assert set(back) == set(state) - {"model.b0.index", "txt/encoder/w"}
    for k, v in back.items():
        np.testing.assert_array_equal(v, state[k], err_msg=k)
    assert TOY.dropped(state) == {"model.b0.index": "a derived buffer",
                                  "txt/encoder/w": "the text tower"}
    assert TOY.writable


def test_prefixes_are_stripped_or_added():
    """`strip`: a start removed before the rules (params/...); `prefix`: a start a bare
    backbone leaves out (tried added)."""
    state = {"params/model.cls": np.ones(4), "dense.kernel": np.ones((4, 3))}
    assert set(TOY.to_zoo(state)) == {"cls_token", "head.weight"}
    assert TOY.coverage(state) == 1.0


def test_stacked_layers_read_as_one_key_per_layer():
    """A scanned checkpoint holds every layer of a kind in one array (layers first): it reads
    as the per-layer keys, and equals the unscanned file."""
    layout = Adapter(name="scan", description="a scanned layout", arch="vit",
                     renames=(Rename("enc_{i}/norm/scale", "blocks.{i}.norm1.weight"),),
                     fuses=(Fuse(tuple(f"enc_{{i}}/{n}/kernel" for n in ("q", "k", "v")),
                                 "blocks.{i}.attn.qkv.weight", "q, k, v", HEADS_IN),),
                     unstack=(("enc/", "enc_{i}/"),))
    depth, e, heads = 3, 4, 2
    scanned = {"enc/norm/scale": RNG.standard_normal((depth, e)),
               **{f"enc/{n}/kernel": RNG.standard_normal((depth, e, heads, e // heads))
                  for n in ("q", "k", "v")}}
    unscanned = {k.replace("enc/", f"enc_{i}/"): v[i] for k, v in scanned.items()
                 for i in range(depth)}
    a, b = layout.to_zoo(scanned), layout.to_zoo(unscanned)
    assert sorted(a) == sorted(b) and len(a) == 2 * depth
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    np.testing.assert_array_equal(a["blocks.1.attn.qkv.weight"][:e],
                                  scanned["enc/q/kernel"][1].reshape(e, e).T)
    assert layout.coverage(scanned) == 1.0
    assert not layout.writable
    with pytest.raises(AdapterError, match=r"changed one way only \(\(E, heads, D\) -> "
                                           r"\(heads \* D, E\)\): the layout is read"):
        layout.from_zoo(a)


def test_per_index_tensors_stack_into_one_and_back():
    """`Stack`: a mixture's experts stored one by one (two parts each) read as one stacked
    tensor, written back one by one; an index's missing part is named."""
    stack = Adapter("experts", "per-expert", "toy", renames=(Rename("{r}", "{r}"),),
                    stacks=(Stack(("l.{i}.e.{j}.a", "l.{i}.e.{j}.b"), "l.{i}.fused", "a and b"),))
    foreign = {f"l.0.e.{j}.{p}": np.full((2, 3), 10 * j + n) for j in range(3)
               for n, p in enumerate("ab")}
    foreign["l.0.other"] = np.zeros(1)
    state = stack.to_zoo(foreign)
    assert state["l.0.fused"].shape == (3, 4, 3) and state["l.0.fused"][2, 2:].min() == 21
    assert "l.0.other" in state
    back = stack.from_zoo(state)
    assert back.keys() == foreign.keys()
    assert all(np.array_equal(back[k], foreign[k]) for k in foreign)
    del foreign["l.0.e.1.b"]
    with pytest.raises(AdapterError, match=r"a and b of 'l.0.fused' are stored apart and 1 "
                                           r"are missing \(index, part\): \[\(1, 1\)\]"):
        stack.to_zoo(foreign)


def test_refusals_name_the_keys():
    with pytest.raises(AdapterError, match=r"1 key\(s\) have no place in the zoo's vit: "
                                           r"'model.extra'"):
        TOY.to_zoo({**_toy_state(), "model.extra": np.zeros(1)})
    state = _toy_state()
    del state["model.b0.v.weight"]
    with pytest.raises(AdapterError, match=r"query, key and value are stored apart and "
                                           r"'model.b0.v.weight' is missing"):
        TOY.to_zoo(state)
    with pytest.raises(AdapterError, match=r"'model.pool.in_proj' has 5 rows, which do not "
                                           r"split as \(1, 2\)"):
        TOY.to_zoo({**_toy_state(), "model.pool.in_proj": np.zeros((5, 4))})
    with pytest.raises(AdapterError, match=r"needs the zoo's pool.q.weight too"):
        TOY.from_zoo({"pool.kv.weight": np.zeros((4, 4))})


def test_the_canonical_names_of_a_foreign_state_and_the_notes_of_what_was_left_out():
    """`to_canonical_names` is the one renaming step of the checkpoint readers and
    `import_state`: the adapter found by content, the keys it leaves out noted."""
    adapters.register(TOY)
    try:
        state, found, notes = adapters.to_canonical_names(_toy_state(), "vit")
        assert found is TOY and "cls_token" in state
        assert notes == ["left out 1 key(s) of the a toy layout layout: a derived buffer",
                         "left out 1 key(s) of the a toy layout layout: the text tower"]
        same, none, nothing = adapters.to_canonical_names({"cls_token": np.zeros(3)}, "vit")
        assert none is None and nothing == [] and list(same) == ["cls_token"]
    finally:
        adapters._ADAPTERS.pop("toy")
