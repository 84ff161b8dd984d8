"""`python -m zoo.bench convert` on a tiny ViT: its record, its cleanup, its measurements."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from zoo.bench.cli import main
from zoo.bench.convert import Generated, generate, markdown, measure


def test_measure_counts_the_child_only():
    """The child's own peak: a large parent (this test process) does not leak into it."""
    big = measure([sys.executable, "-c", "import numpy as np; np.ones(40_000_000).sum()"])
    small = measure([sys.executable, "-c", "pass"])
    assert big["rc"] == small["rc"] == 0
    assert big["peak_rss_bytes"] >= 320e6 > 100e6 > small["peak_rss_bytes"]
    failed = measure([sys.executable, "-c", "raise SystemExit('boom')"])
    assert (failed["rc"], failed["error"]) == (1, "boom")


def test_generated_checkpoint_is_written_lazily(tmp_path):
    from safetensors.numpy import load_file

    from zoo.bench.convert import SIZES
    from zoo.names import make_config

    config = make_config("vit", **SIZES["vit-tiny"])
    size = generate(config, tmp_path / "g.safetensors")
    arrays = load_file(str(tmp_path / "g.safetensors"))
    assert size == (tmp_path / "g.safetensors").stat().st_size
    assert sum(a.nbytes for a in arrays.values()) > 0.99 * size
    first = np.asarray(Generated((3, 4), 7))
    np.testing.assert_array_equal(first, np.asarray(Generated((3, 4), 7)))
    assert first.dtype == np.float32 and np.abs(first).max() <= 0.5


def test_convert_bench_record(tmp_path, capsys):
    out = tmp_path / "r.json"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert main(["convert", "--sizes", "vit-tiny", "--sources", "safetensors,eqx",
                 "--targets", "safetensors,eqx", "--scratch", str(scratch), "--json", str(out),
                 "--markdown"]) == 0
    record = json.loads(out.read_text())
    (size,) = record["sizes"]
    pairs = [(r["source"], r["target"]) for r in size["rows"]]
    assert pairs == [("safetensors", "safetensors"), ("safetensors", "eqx"),
                     ("eqx", "safetensors")]
    assert set(size["floors"]) == {"safetensors"}
    for row in size["rows"]:
        assert row["rc"] == 0 and row["bytes_written"] >= 0.99 * size["checkpoint_bytes"]
        assert row["peak_rss_bytes"] > size["checkpoint_bytes"]
    assert record["host_load_avg"] and not list(scratch.iterdir())  # all deleted
    assert "| vit-tiny | safetensors | eqx |" in capsys.readouterr().out
    assert markdown(record).count("\n") == 1 + 1 + 3


@pytest.mark.parametrize("argv, needle", [
    (["--sizes", "vit-z"], "--sizes 'vit-z': unknown ['vit-z']"),
    (["--targets", ""], "--targets '': unknown []"),
])
def test_convert_bench_bad_arguments(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(["convert", *argv])
    assert e.value.code == 2 and needle in capsys.readouterr().err
