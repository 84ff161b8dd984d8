"""The language models' `prefill` and `decode` benchmark modes run on a tiny config: the
fairness check passes (same prompt logits, same greedy tokens in every library and in
`transformers`), every call style is timed against the floor measured in the run, the table
fits 80 columns, and the command line writes the record."""

from __future__ import annotations

import json

import pytest

import zoo
from zoo.bench import generation
from zoo.bench.cli import main
from zoo.bench.fairness import FairnessError

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_decode_mode_runs_every_style_against_the_floor() -> None:
    tiny = dict(zoo.architecture("llama").config.TINY)
    run = generation.GenerationRun("llama", ("eqx", "torch"), tiny, prompt=4, new=3, repeat=1)
    record = generation.run_generation(run)
    assert record["fairness"]["same_tokens"]
    assert set(record["fairness"]["logits_relative"]) == {"eqx", "torch", "transformers"}
    rows = {(r["impl"], r["style"]) for r in record["results"]}
    assert rows == {("eqx", s) for s in generation.STYLES} | {("torch", "eager"),
                                                                ("torch", "hf-generate")}
    assert record["bandwidth_bytes_per_s"] > 1e8 and record["floor"]["decode_s"] > 0
    # (3 tokens timed once: the decode step's difference of two times may be noise)
    assert all(isinstance(r["floor_ratio"], float) and r["prefill_tokens_per_s"] > 0
               and r["generate_s"] > 0 for r in record["results"])
    lines = generation.table(record)
    assert len(lines) == 3 + len(rows) and max(map(len, lines)) <= 80


def test_fairness_refuses_different_tokens() -> None:
    import numpy as np

    same = np.ones((1, 4))
    with pytest.raises(FairnessError, match="greedy tokens differ"):
        generation._fairness({"a": np.zeros((1, 5), int), "b": np.ones((1, 5), int)},
                             {"torch": same, "eqx": same}, "torch")
    with pytest.raises(FairnessError, match="prompt logits"):
        generation._fairness({"a": np.zeros((1, 5), int)}, {"torch": same, "eqx": 2 * same},
                             "torch")


@pytest.mark.full_only
def test_cli_prefill_mode_writes_the_record(tmp_path, capsys) -> None:
    out = tmp_path / "gen.json"
    assert main(["gpt2", "--preset", "tiny", "--mode", "prefill", "--impl", "linen,nnx,torch",
                 "--prompt", "4", "--new-tokens", "3", "--repeat", "1", "--no-transformers",
                 "--no-progress", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert {r["impl"] for r in record["results"]} == {"linen", "nnx", "torch"}
    assert all(len(line) <= 80 for line in capsys.readouterr().out.splitlines())
