"""Streaming conversion and sharded safetensors: sources are mapped, not copied; safetensors
are written one tensor at a time; HF-style shards (a folder or its index file) are read and
written with a size limit."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import tracemalloc
import weakref
from pathlib import Path

import chex
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import converters
from converters import Checkpoint, read, write
from converters.__main__ import main
from converters.checkpoints import CheckpointError
from converters.checkpoints.formats.safetensors_io import parse_size, plan_shards
from converters.core import canonical_spec
from zoo.names import make_config

VIT = make_config("vit", width=64, depth=4, num_heads=2, patch_size=4, image_size=[16, 16],
                  num_classes=10)


def vit_state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s.shape).astype(np.float32)
            for k, s in canonical_spec(VIT).items()}


def assert_same(ck: Checkpoint, state: dict[str, np.ndarray]) -> None:
    assert list(ck.state) == list(canonical_spec(VIT))  # canonical order
    chex.assert_trees_all_equal({k: np.asarray(v) for k, v in ck.state.items()}, state)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "src.safetensors"
    save_file(vit_state(), str(path))
    return path


class Counted:
    """A source array that counts the arrays it hands out while they are alive."""

    alive = 0
    peak = 0

    def __init__(self, a: np.ndarray):
        self.a, self.shape, self.dtype = a, a.shape, a.dtype

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.a.copy()
        Counted.alive += 1
        Counted.peak = max(Counted.peak, Counted.alive)
        weakref.finalize(out, Counted.release)
        return out

    @staticmethod
    def release() -> None:
        Counted.alive -= 1


@pytest.mark.parametrize("shard_size", [None, "40KB"])
def test_safetensors_written_one_tensor_at_a_time(tmp_path, shard_size):
    Counted.alive = Counted.peak = 0
    state = vit_state()
    ck = Checkpoint(VIT, {k: Counted(v) for k, v in state.items()})
    out = write(ck, tmp_path / "out", "canonical", shard_size=shard_size)
    assert Counted.peak == 1 and Counted.alive == 0
    assert_same(read(out), state)


def test_reading_safetensors_maps_the_file(src):
    ck = read(src, config=VIT)
    assert all(isinstance(v, np.memmap) for v in ck.state.values())
    tracemalloc.start()
    try:
        np.asarray(ck.state["head.weight"]).sum()  # the tracer sees numpy's own allocations
        np.ones(1000).sum()
        assert tracemalloc.get_traced_memory()[1] >= 8000
    finally:
        tracemalloc.stop()


def test_convert_holds_no_copy_of_the_checkpoint(src, tmp_path):
    total = src.stat().st_size
    largest = max(v.nbytes for v in vit_state().values())
    tracemalloc.start()
    try:
        converters.convert_file(src, tmp_path / "out.safetensors", "torch", config=VIT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert largest <= total / 8
    assert peak < total / 3, (peak, total)  # a whole copy would be > total


def test_shards_round_trip_and_hf_layout(src, tmp_path):
    out = tmp_path / "shards"
    converters.convert_file(src, out, "torch", config=VIT, shard_size="60KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert set(index["weight_map"].values()) == set(files)
    sizes = [sum(a.nbytes for a in load_file(str(out / f)).values()) for f in files]
    assert sum(sizes) == index["metadata"]["total_size"]
    largest = max(v.nbytes for v in vit_state().values())
    assert all(s <= max(60_000, largest) for s in sizes)
    for path in (out, out / "model.safetensors.index.json"):
        ck = read(path)
        assert (ck.source.fmt, ck.config) == ("torch", VIT)
        assert_same(ck, vit_state())


def test_reads_shards_written_by_hand(tmp_path):
    """HF's layout without our metadata: the architecture comes from --arch / --config."""
    state = vit_state(1)
    hub = tmp_path / "hub"
    hub.mkdir()
    keys = list(state)
    halves = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, part in halves.items():
        save_file({k: state[k] for k in part}, str(hub / name), metadata={"format": "pt"})
    (hub / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": {k: n for n, p in halves.items()
                                                       for k in p}}))
    assert_same(read(hub, config=VIT), state)
    out = tmp_path / "model.eqx"
    converters.convert_file(hub, out, "eqx", config=VIT)
    assert_same(read(out), state)


def test_canonical_shards_stay_canonical(src, tmp_path):
    out = tmp_path / "c"
    converters.convert_file(src, out, "canonical", config=VIT, shard_size=10**9)
    assert len(list(out.glob("*.safetensors"))) == 1
    assert read(out).source.fmt == "canonical"


@pytest.mark.parametrize("damage, needle", [
    ("missing", "is not a file beside the index"),
    ("extra key", "disagree about the keys"),
    ("no map", "needs a 'weight_map'"),
])
def test_bad_index_is_one_clear_error(src, tmp_path, damage, needle):
    out = tmp_path / "shards"
    converters.convert_file(src, out, "torch", config=VIT, shard_size="100KB")
    index = out / "model.safetensors.index.json"
    raw = json.loads(index.read_text())
    if damage == "missing":
        (out / "model-00002-of-" f"{len(list(out.glob('*.safetensors'))):05d}.safetensors"
         ).unlink()
    elif damage == "extra key":
        raw["weight_map"]["ghost.weight"] = "model-00001-of-" + next(
            iter(raw["weight_map"].values())).rsplit("-of-", 1)[1]
        index.write_text(json.dumps(raw))
    else:
        index.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointError, match=needle):
        read(index, config=VIT)


def test_shard_size_errors(src, tmp_path, capsys):
    assert main(["convert", str(src), str(tmp_path / "o.eqx"), "--to", "eqx", "--config",
                 VIT.to_json(), "--shard-size", "1GB"]) == 2
    assert "cannot be written in shards" in capsys.readouterr().err
    assert main(["convert", str(src), str(tmp_path / "o"), "--to", "torch", "--config",
                 VIT.to_json(), "--shard-size", "lots"]) == 2
    assert "shard size 'lots'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.eqx").exists()


def test_sizes_and_plans():
    assert [parse_size(s) for s in ("5GB", "500MB", "2GiB", "1000", 7)] == [
        5 * 10**9, 5 * 10**8, 2 * 2**30, 1000, 7]
    arrays = {k: np.zeros(n, np.uint8) for k, n in [("a", 4), ("b", 4), ("c", 9), ("d", 1)]}
    assert plan_shards(arrays, 8) == [["a", "b"], ["c"], ["d"]]


def test_progress_counts_bytes(src, tmp_path):
    seen: dict[str, list[tuple[int, int | None]]] = {}
    converters.convert_file(src, tmp_path / "o.safetensors", "canonical", config=VIT,
                            progress=lambda d, done, total: seen.setdefault(d, []).append(
                                (done, total)))
    total = sum(v.nbytes for v in vit_state().values())
    writing = seen["writing"]
    assert writing[0] == (0, total) and writing[-1] == (total, total)
    assert len(writing) == len(canonical_spec(VIT)) + 1  # one step per tensor


@pytest.mark.parametrize("fmt", ["linen", "nnx"])
def test_orbax_written_one_layer_at_a_time(tmp_path, monkeypatch, fmt):
    """Each native array is made by its layer's rule as orbax writes it: at no time are the
    native arrays of more than one layer held (no native model is built)."""
    from converters.checkpoints.formats import layer_plan

    sources, held = [], []
    init, take = layer_plan.LayerSource.__init__, layer_plan.LayerSource.take

    def recording_init(self, *args):
        init(self, *args)
        sources.append(self)

    def counting_take(self, name):
        out = take(self, name)
        held.append(sum(len(s.native) + 1 for s in sources if s.native))  # +1: `out`
        return out

    monkeypatch.setattr(layer_plan.LayerSource, "__init__", recording_init)
    monkeypatch.setattr(layer_plan.LayerSource, "take", counting_take)
    state = vit_state()
    out = write(Checkpoint(VIT, dict(state)), tmp_path / fmt, fmt)
    largest = max(len(s.plan.native[s.layer.name]) for s in sources)
    assert len(held) == sum(len(s.plan.native[s.layer.name]) for s in sources) > 3 * largest
    assert max(held) <= largest
    monkeypatch.undo()
    assert_same(read(out), state)


def test_orbax_read_a_few_layers_at_a_time(src, tmp_path, monkeypatch):
    """Reading restores a chunk of layers per orbax call (at most CHUNK_BYTES, at least one
    layer) when its first array is used; the reader keeps no array it handed out."""
    from converters.checkpoints.formats import orbax_layers

    out = tmp_path / "nnx"
    converters.convert_file(src, out, "nnx", config=VIT)
    monkeypatch.setattr(orbax_layers, "CHUNK_BYTES", 1)  # one layer per call
    restores = []
    restore = orbax_layers.LayerReader._restore
    monkeypatch.setattr(orbax_layers.LayerReader, "_restore",
                        lambda self, chunk: (restores.append(len(chunk)), restore(self, chunk))[1])
    ck = read(out)
    assert not restores and all(isinstance(v, orbax_layers.Restored) for v in ck.state.values())
    reader = next(iter(ck.state.values())).reader
    state, ready = vit_state(), []
    for k, v in ck.state.items():
        np.testing.assert_array_equal(np.asarray(v), state[k])
        ready.append(len(reader.ready))
    assert len(restores) == len(reader.plan.layers)
    assert max(ready) <= 1 and not reader.ready
    key, again = next(iter(ck.state.items()))
    np.testing.assert_array_equal(np.asarray(again), state[key])  # read afresh
    assert len(restores) == len(reader.plan.layers) + 1 and not reader.ready
    assert again.tobytes() == state[key].tobytes() and again.ndim == state[key].ndim
    # NumPy's operators and functions read it as they would an array
    np.testing.assert_array_equal(again - state[key], np.zeros_like(state[key]))
    np.testing.assert_array_equal(np.abs(2 * again), np.abs(2 * state[key]))
    assert (again == state[key]).all()


def test_orbax_writes_overlap_within_write_bytes(tmp_path, monkeypatch):
    """Several arrays are being written at once, never more than `WRITE_BYTES` of them."""
    from converters.checkpoints.formats import orbax_layers

    state = vit_state()
    limit = 3 * max(a.nbytes for a in state.values())
    real, most = orbax_layers.InFlight.holding, {"held": 0, "at_once": 0, "now": 0}

    @contextlib.asynccontextmanager
    async def holding(self, n):
        async with real(self, n):
            most["now"] += 1
            most["held"] = max(most["held"], self.held)
            most["at_once"] = max(most["at_once"], most["now"])
            try:
                yield
            finally:
                most["now"] -= 1

    monkeypatch.setattr(orbax_layers, "WRITE_BYTES", limit)
    monkeypatch.setattr(orbax_layers.InFlight, "holding", holding)
    out = write(Checkpoint(VIT, dict(state)), tmp_path / "nnx", "nnx")
    assert most["at_once"] > 1 and 0 < most["held"] <= limit
    monkeypatch.undo()
    assert_same(read(out), state)


def test_in_flight_admits_in_order_within_the_limit():
    from converters.checkpoints.formats.orbax_layers import InFlight

    room, log = InFlight(10), []

    async def one(i: int, n: int) -> None:
        async with room.holding(n):
            log.append((i, room.held))
            await asyncio.sleep(0.001 * (5 - i))

    async def all_of(sizes: list[int]) -> None:
        await asyncio.gather(*(one(i, n) for i, n in enumerate(sizes)))

    asyncio.run(all_of([4, 4, 30, 1, 2]))  # 30 exceeds the limit: admitted alone
    assert [i for i, _ in log] == [0, 1, 2, 3, 4]
    assert dict(log) == {0: 4, 1: 8, 2: 30, 3: 1, 4: 3} and room.held == 0


@pytest.mark.parametrize("shape", [(600, 530), (530, 1100), (7, 900), (3, 4, 5), (1030,)])
def test_contiguous_copies_tile_by_tile(shape):
    from converters.checkpoints.io import contiguous

    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for view in (a, a.T, a[::2], a[..., ::-1]):
        before = view.copy()
        out = contiguous(view)
        assert out.flags.c_contiguous and out.tobytes() == np.ascontiguousarray(view).tobytes()
        np.testing.assert_array_equal(view, before)


def test_equinox_written_record_by_record(tmp_path, monkeypatch):
    """An Equinox file is streamed through the layer plan (no native model is built), byte
    for byte the file of the native model."""
    from converters.checkpoints.formats import equinox, layer_plan
    from converters.core import from_canonical

    state = vit_state()
    by_hand = tmp_path / "native.eqx"
    equinox.save_eqx_tree(from_canonical(state, VIT, "eqx"), by_hand)
    taken = []
    take = layer_plan.LayerSource.take
    monkeypatch.setattr(layer_plan.LayerSource, "take",
                        lambda self, name: (taken.append(name), take(self, name))[1])
    monkeypatch.setattr(equinox.NativeFormat, "native", None)  # never built
    out = write(Checkpoint(VIT, dict(state)), tmp_path / "m.eqx", "eqx")
    assert len(taken) >= len(state) and out.read_bytes() == by_hand.read_bytes()
    monkeypatch.undo()
    assert_same(read(out), state)



def test_equinox_read_record_by_record(tmp_path, monkeypatch):
    """An Equinox file of a model without state is read as memory maps of its records, each
    layer through its rule: no native model is built, and the file is not copied where the
    rule only views its arrays (the attention's q, k and v are joined: a new array)."""
    from converters.checkpoints.formats import equinox

    state = vit_state()
    out = write(Checkpoint(VIT, dict(state)), tmp_path / "m.eqx", "eqx")
    monkeypatch.setattr(equinox, "_deserialise", None)  # never called
    ck = read(out)
    assert_same(ck, state)
    mapped = {k for k, v in ck.state.items() if isinstance(v, np.memmap)}
    assert mapped == {k for k in state if ".attn.qkv." not in k}

@pytest.mark.parametrize("fmt, name", [("eqx", "m.eqx"), ("torch", "m.pt")])
def test_sidecar_digest_taken_while_writing(tmp_path, monkeypatch, fmt, name):
    """`.eqx` and `.pt` files are hashed as their bytes are written, never read back; the
    sidecar records the size and SHA-256 of the file as it lies on disk."""
    from converters.checkpoints import format as format_module
    from converters.checkpoints.io import sidecar_path

    def read_back(path):
        raise AssertionError(f"{path} read back for its digest")

    state = vit_state()
    monkeypatch.setattr(format_module, "digest", read_back)
    out = write(Checkpoint(VIT, dict(state)), tmp_path / name, fmt)
    monkeypatch.undo()
    data = out.read_bytes()
    assert json.loads(sidecar_path(out).read_text())["data"] == {
        "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert_same(read(out), state)


def test_a_command_checks_its_source_digest_once(tmp_path, monkeypatch, capsys):
    """Detection hashes the data a sidecar describes; the command line's detection and the
    conversion's read share it while the file is unchanged."""
    from converters.checkpoints import metadata

    src = write(Checkpoint(VIT, vit_state()), tmp_path / "m.eqx", "eqx")
    hashed = []
    digest = metadata.digest
    monkeypatch.setattr(metadata, "digest", lambda p: (hashed.append(p), digest(p))[1])
    assert main(["convert", str(src), str(tmp_path / "o.safetensors"), "--to", "torch"]) == 0
    assert hashed == [src]
    capsys.readouterr()
    read(src), read(src)  # outside a command: detected afresh each time
    assert hashed == [src] * 3

def test_hashing_file_refuses_to_seek(tmp_path):
    """A writer that would seek back is refused, not left with a digest of other bytes."""
    from converters.checkpoints.staging import HashingFile

    with HashingFile(tmp_path / "f") as f:
        f.write(b"abc")
        f.write(np.arange(3, dtype=np.int16))
        assert not f.seekable() and f.tell() == 9
        with pytest.raises(io.UnsupportedOperation):
            f.seek(0)
    body = (tmp_path / "f").read_bytes()
    assert f.digest() == {"size": 9, "sha256": hashlib.sha256(body).hexdigest()}
