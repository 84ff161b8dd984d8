"""The language models' `prefill` and `decode` benchmark modes run on a tiny config: the
fairness check passes (same prompt logits, same greedy tokens in every library and in
`transformers`), every call style is timed against the floor measured in the run, the table
fits 80 columns, and the command line writes the record. `--precision` reaches the decode
step's program and sets the logits' bound by the compute format (a TF32-sized difference
passes at "default" on a GPU, not at "highest"); the default prompt fits a tiny preset and a
prompt too long for the model gets one line."""

from __future__ import annotations

import json

import pytest

import zoo
from zoo.bench import generation
from zoo.bench.cli import main
from zoo.bench.fairness import FairnessError

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.full_only  # fresh interpreters or files: the quick subset's budget
def test_decode_mode_runs_every_style_against_the_floor() -> None:
    tiny = dict(zoo.architecture("llama").config.TINY)
    run = generation.GenerationRun("llama", ("eqx", "torch"), tiny, prompt=4, new=6, repeat=1,
                                   styles=tuple(generation.STYLES))
    record = generation.run_generation(run)
    assert record["fairness"]["same_tokens"]
    assert set(record["fairness"]["logits_relative"]) == {"eqx", "torch", "transformers"}
    rows = {(r["impl"], r["style"]) for r in record["results"]}
    assert rows == {("eqx", s) for s in generation.STYLES} | {("torch", "eager"),
                                                                ("torch", "hf-generate")}
    assert record["bandwidth_bytes_per_s"] > 1e8 and record["floor"]["decode_s"] > 0
    # (6 tokens timed once, steps between 3 and 6: the difference of two times may be noise)
    assert all(isinstance(r["floor_ratio"], float) and r["prefill_tokens_per_s"] > 0
               and r["generate_s"] > 0 and r["decode_from"] == 3
               and isinstance(r["loop_setup_s"], float) for r in record["results"])
    lines = generation.table(record)
    assert lines[3 + len(rows)].startswith("once a call, before its steps (ms): eqx loop")
    assert max(map(len, lines)) <= 80


def test_fairness_refuses_different_tokens() -> None:
    import numpy as np

    same = np.ones((1, 4))
    with pytest.raises(FairnessError, match="greedy tokens differ"):
        generation._fairness({"a": np.zeros((1, 5), int), "b": np.ones((1, 5), int)},
                             {"torch": same, "eqx": same}, "torch")
    with pytest.raises(FairnessError, match="prompt logits"):
        generation._fairness({"a": np.zeros((1, 5), int)}, {"torch": same, "eqx": 2 * same},
                             "torch")



def test_tokens_that_part_at_a_near_tie_are_reported_not_refused() -> None:
    """bfloat16's rounding may decide a near-tie either way: where two calls' tokens part,
    the first call's logits on the common prefix say whether the two tokens were within the
    bound; the position and both logits are in the report either way."""
    import numpy as np

    first = np.array([[5, 6, 1, 2, 3], [5, 7, 1, 1, 1]])
    other = first.copy()
    other[1, 3:] = [4, 0]  # row 1 parts at position 3: token 1 there, 4 here
    seen = []

    def score(prefix: np.ndarray, gap: float) -> np.ndarray:
        seen.append(prefix.tolist())
        logits = np.zeros(8, np.float32)
        logits[[1, 4]] = [10.0, 10.0 - gap]
        return logits

    same = np.ones((1, 8))
    report = generation._fairness({"eqx loop": first, "torch eager": other},
                                  {"eqx": same, "torch": same}, "torch", 1e-2,
                                  lambda prefix: score(prefix, 0.05))
    assert seen == [[[5, 7, 1]]] and not report["same_tokens"]
    (tie,) = report["near_ties"]
    assert (tie["call"], tie["row"], tie["position"], tie["tokens"]) == ("torch eager", 1, 3,
                                                                         [1, 4])
    assert tie["logits"] == pytest.approx([10.0, 9.95])
    assert 4e-3 < tie["gap_relative"] < 6e-3  # 0.05 of the largest logit, 10
    with pytest.raises(FairnessError, match=r"at position 3 \(row 1\), logits 1.0e-01 apart"):
        generation._fairness({"eqx loop": first, "torch eager": other},
                             {"eqx": same, "torch": same}, "torch", 1e-2,
                             lambda prefix: score(prefix, 1.0))
    record = {"config": {"arch": "gpt2", "batch": 2, "prompt": 2, "new": 3, "dtype": "bfloat16"},
              "floor": {"decode_s": 1e-3, "weights": 1e6}, "bandwidth_bytes_per_s": 1e10,
              "results": [], "fairness": report}
    assert generation.table(record)[-1] == (
        "near-tie: torch eager's row 1 parts at token 3 (logits 10 and 9.95)")
    assert generation._fairness({"a": first, "b": first}, {"eqx": same}, None, 1e-2,
                                lambda prefix: score(prefix, 1.0))["same_tokens"]

@pytest.mark.full_only
def test_cli_prefill_mode_writes_the_record(tmp_path, capsys) -> None:
    out = tmp_path / "gen.json"
    assert main(["gpt2", "--preset", "tiny", "--mode", "prefill", "--impl", "linen,nnx,torch",
                 "--prompt", "4", "--new-tokens", "3", "--repeat", "1", "--no-transformers",
                 "--no-progress", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert {r["impl"] for r in record["results"]} == {"linen", "nnx", "torch"}
    assert all(len(line) <= 80 for line in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize("precision", [pytest.param("high", marks=pytest.mark.full_only),
                                       "highest"])
def test_precision_reaches_the_decode_program(precision: str) -> None:
    """(The suite runs at "highest" globally: "default" would leave that.)"""
    tiny = dict(zoo.architecture("llama").config.TINY)
    run = generation.GenerationRun("llama", ("nnx",), tiny, prompt=4, new=2, repeat=1,
                                   hf=False, precision=precision)
    record = generation.run_generation(run)
    dots = [precision.upper()]
    assert record["fairness"]["precision"]["decode_step_dots"] == {"nnx": dots}
    assert record["config"]["precision"] == precision
    assert record["precision_settings"]["jax_default_matmul_precision"] == precision
    assert record["fairness"]["bound"] == generation.logits_bound("float32", precision)


def test_logits_bound_follows_the_compute_format() -> None:
    """The H100 run's 9.1e-4 (TF32 against full float32) passes at "default" on a GPU backend
    and is refused at "highest"; on the CPU both are full float32."""
    import numpy as np

    ref = np.linspace(-10, 10, 64, dtype=np.float32)[None]
    tf32 = ref + 9.1e-4 * 10 * np.cos(np.arange(64, dtype=np.float32))
    tokens = {"a": np.zeros((1, 5), int)}
    bound = generation.logits_bound("float32", "default", backend="gpu")
    report = generation._fairness(tokens, {"torch": ref, "eqx": tf32}, "torch", bound)
    assert 9e-4 < report["logits_relative"]["eqx"] < bound
    for strict in (generation.logits_bound("float32", "highest", backend="gpu"),
                   generation.logits_bound("float32", "default", backend="cpu")):
        with pytest.raises(FairnessError, match=r"prompt logits 9\.1e-04"):
            generation._fairness(tokens, {"torch": ref, "eqx": tf32}, "torch", strict)
    assert generation.logits_bound("bfloat16", "highest") > 1e-2


def test_default_prompt_fits_a_tiny_preset_and_a_bad_one_gets_one_line(capsys) -> None:
    from zoo.bench.options import bench_parser

    args = bench_parser().parse_args(["gpt2", "--preset", "tiny", "--mode", "decode"])
    run = generation.run_from_args(args)
    assert run.prompt + run.new <= 16 and run.new > 1 and run.styles == generation.FASTEST
    assert run.repeat == 3
    with pytest.raises(SystemExit):
        main(["gpt2", "--preset", "tiny", "--mode", "decode", "--prompt", "40"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert "--prompt 40: 41 tokens" in err[-1] and "16 positions" in err[-1]
    assert not any("Traceback" in line for line in err)
    assert generation.styles("all") == tuple(generation.STYLES)
    with pytest.raises(ValueError, match="--call fast"):
        generation.styles("fast")
    with pytest.raises(SystemExit):  # a vision model: one line, not an AttributeError
        main(["vit", "--preset", "tiny", "--mode", "decode"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vit does not generate text (not a language model)" in err[0]


def test_a_step_lost_in_the_noise_prints_dashes_not_a_negative_time() -> None:
    """At tiny sizes the decode step (the difference of two timings) can come out at or below
    zero: its ms/step, tokens/s and ratios print "-", never a negative number, and a row's
    ratio to PyTorch uses PyTorch's step only where it was measured."""
    row = {"impl": "linen", "style": "loop", "prefill_tokens_per_s": 7926.0,
           "decode_s": -0.00045, "decode_tokens_per_s": None, "floor_ratio": -214.99,
           "compile_s": 5.66}
    ok = {**row, "impl": "eqx", "decode_s": 0.00063, "decode_tokens_per_s": 12702.7,
          "floor_ratio": 297.59}
    torch = {**ok, "impl": "torch", "style": "eager", "decode_s": 0.04083,
             "decode_tokens_per_s": 195.9, "floor_ratio": 19292.68, "compile_s": 0.0}
    record = {"config": {"arch": "gpt2", "batch": 8, "prompt": 8, "new": 8,
                         "dtype": "float32"},
              "floor": {"decode_s": 2.1e-6, "weights": 1e6}, "bandwidth_bytes_per_s": 13.7e9,
              "results": [ok, row, torch]}
    lines = generation.table(record)
    assert max(map(len, lines)) <= 80
    linen = next(line for line in lines if line.startswith("linen"))
    assert "-0" not in linen and linen.split()[3:7] == ["-", "-", "-", "-"]
    eqx = next(line for line in lines if line.startswith("eqx")).split()
    assert eqx[3:7] == ["0.63", "12702.7", "297.59", "0.02"]


def test_a_decode_step_is_timed_between_two_loop_programs(monkeypatch) -> None:
    """A loop program's call: 0.5 s once (XLA's hoisted weight conversions), then 10 ms a
    step; the 1-token program has no loop (nor its 0.5 s). The step is timed between two
    loop programs (16 and 32 tokens): 10 ms, not charged the 0.5 s, which is the record's
    `loop_setup_s` and the table's last line."""
    def seconds(n: int) -> float:
        return 0.1 + (0.5 if n >= 3 else 0.0) + 0.01 * (n - 1)

    monkeypatch.setattr(generation, "_seconds", lambda fn: seconds(fn()))
    timed = generation._Timed("eqx", "loop", lambda n: n)
    run = generation.GenerationRun("llama", ("eqx",), {}, new=32, repeat=1)
    r = timed.measure(run)
    assert r["decode_from"] == 16 and sorted(timed.first) == [1, 16, 32]
    assert r["decode_s"] == pytest.approx(0.01) and r["loop_setup_s"] == pytest.approx(0.5)
    assert r["decode_tokens_per_s"] == pytest.approx(100.0)
    assert [generation.base_tokens(n) for n in (3, 5, 6, 32)] == [1, 1, 3, 16]
    record = {"config": {"arch": "llama", "batch": 1, "prompt": 32, "new": 32,
                         "dtype": "bfloat16"}, "floor": {"decode_s": 5e-3, "weights": 1e6},
              "bandwidth_bytes_per_s": 1e10,
              "results": [{**r, "floor_ratio": 2.0, "impl": i} for i in ("eqx", "linen")]}
    lines = generation.table(record)
    assert lines[-1] == "once a call, before its steps (ms): eqx loop 500, linen loop 500"
    assert max(map(len, lines)) <= 80
