"""python -m zoo.bench: the CI run of every tiny preset, the fairness refusal, report, dispatch."""

from __future__ import annotations

import itertools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.bench import cli, fairness
from zoo.bench.archs.convt import LinenConvT
from zoo.bench.fairness import FairnessError, check_fairness
from zoo.bench.options import resolve_calls
from zoo.bench.presets import ARCHS, PRESETS, PresetError, find_preset
from zoo.bench.records import record_name
from zoo.bench.subjects import Subject, Task, build_config, build_models, make_task
from zoo.runtime import precision as policy
from zoo.testing import assert_close

LAYER_ARCH = "convt"  # the bench-only subject: one 3-D conv-transpose layer
HAVE_TORCH = any(impl == "torch" for _, impl in zoo.list_implementations())
IMPLS = (*zoo.JAX_IMPLS, "torch") if HAVE_TORCH else zoo.JAX_IMPLS


# --------------------------------------------------------------------------- CI: tiny presets
@pytest.mark.whole_model
@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_preset_every_impl(arch, tmp_path):
    """CI: the tiny preset of every architecture, every implementation, forward and train.

    The MLP runs every call style of every library (--call all); the others the default one.
    """
    from zoo.bench.styles import available_styles

    path = tmp_path / f"{arch}.json"
    argv = [arch, "--preset", "tiny", "--impl", "all", "--mode", "both", "--repeat", "3",
            "--warmup", "1", "--settle", "0", "--json", str(path), "--no-progress"]
    if arch in ("decoder3d", LAYER_ARCH):
        argv += ["--method", "lhs_dilation"]  # the cheapest to compile (CI time)
    if arch == "mlp":
        argv += ["--call", "all", "--steps-per-call", "3"]
    assert cli.main(argv) == 0
    record = json.loads(path.read_text())

    assert record["kind"] == "model" and record["fairness"]["passed"]
    assert record["config"]["settle_s"] == 0.0
    assert record["config"]["arch"] == arch and record["config"]["preset"] == "tiny"
    for key in ("jax", "jaxlib", "flax", "equinox", "optax", "torch", "python"):
        assert key in record["versions"]
    assert record["device"]["backend"] == jax.default_backend()
    got = {(r["impl"], r["mode"]) for r in record["results"]}
    assert got == {(impl, mode) for impl in IMPLS for mode in ("forward", "train")}
    for r in record["results"]:
        assert r["time"]["n"] == 3 and r["time"]["median_s"] > 0
        assert r["time"]["p10_s"] <= r["time"]["median_s"] <= r["time"]["p90_s"]
        assert r["flops"] > 0 and r["ratio_to_fastest"] >= 1.0
        assert sum(r["round_sizes"]) == 3 and r["ratio_to_fastest_rounds"]["rounds"] == len(
            r["round_sizes"])
        if r["impl"] == "torch":
            assert "JAX twin" in r["flops_source"]
        elif r["call"] == "fast":
            assert r["compile"]["compile_s"] > 0 and r["default"]
    fl = record["fairness"]
    assert len(set(fl["parameters"].values())) == 1 and set(fl["parameters"]) == set(IMPLS)
    flops = {name: e["flops"] for name, e in fl["forward"]["flops"].items()}
    assert len(flops) == len(zoo.JAX_IMPLS)
    # The same count within 1%, or (an elementwise-dominated program: the toy's LayerNorm per
    # sample against batched) every count at or above the useful FLOPs, noted as accounting.
    assert max(flops.values()) <= 1.01 * min(flops.values()) or any(
        "XLA's accounting" in note for note in fl.get("notes", ()))
    if arch != "mlp":
        return
    # --call all: every style each library offers, all compiling to the same FLOP count.
    for impl in IMPLS:
        for mode in ("forward", "train"):
            rows = [r for r in record["results"] if r["impl"] == impl and r["mode"] == mode]
            assert sorted(r["call"] for r in rows) == sorted(available_styles(impl, fused=True))
            assert all(r["steps_per_call"] == (3 if r["call"] == "fused" else 1) for r in rows)
            # fused rows: FLOPs of one step (not of the loop), equal to the single step's
            flops = [r["flops"] for r in rows if r["flops_source"] == "lowered"]
            assert impl == "torch" or max(flops) <= 1.01 * min(flops)
    assert {r["call"] for r in record["results"] if r["idiomatic"]} == {
        "filter_jit", "jit", "nnx_jit", "eager"} & {
        c for i in IMPLS for c in available_styles(i)}


# --------------------------------------------------------------------------- fairness refusal
class Conv3D(nn.Module):
    """A Linen 3-D conv whose kernel_size is given as in the published comparison."""

    kernel_size: int | tuple[int, ...]

    @nn.compact
    def __call__(self, x, *, train=False):
        return nn.Conv(4, self.kernel_size, padding="SAME")(x)


def _conv_subject(kernel_size, name, task):
    module = Conv3D(kernel_size)
    variables = jax.jit(module.init)(jax.random.key(0), task.x.transpose(0, 2, 3, 4, 1))
    return Subject("linen", (module, variables), task, name=name)


def test_fairness_refuses_int_kernel_size():
    """An int kernel_size makes Flax convolve only the last axis: same output shape, 1/9 of
    the FLOPs. The check refuses the comparison and says why, with the numbers."""
    x = jax.random.normal(jax.random.key(0), (2, 3, 6, 6, 6))
    task = Task(x, x, "mse")
    good = _conv_subject((3, 3, 3), "linen-3d", task)
    bad = _conv_subject(3, "linen-int-kernel", task)
    assert good.fast_forward()(good.x).shape == bad.fast_forward()(bad.x).shape

    with pytest.raises(FairnessError) as err:
        check_fairness({"linen-3d": good, "linen-int-kernel": bad})
    message = str(err.value)
    assert "nothing was timed" in message
    assert "FLOPs (forward): linen-int-kernel counts" in message
    flops = err.value.report["forward"]["flops"]
    ratio = flops["linen-int-kernel"]["ratio"]
    assert 0.1 < ratio < 0.2  # 1/9 of the multiply-adds; the bias adds are the same
    assert f"{ratio:.3f}x the" in message and "int kernel_size" in message
    assert "parameter count: linen-int-kernel has 40, linen-3d 328" in message
    assert any(p.startswith("forward output: linen-int-kernel differs") for p in
               err.value.problems)


def test_flop_check_survives_a_backend_without_counts(monkeypatch):
    """A backend whose cost analysis gives None, -1 or [] (seen on GPUs): the check counts the
    pre-optimisation program instead, says so, and still refuses the int-kernel pair; with no
    count from any source it refuses rather than passing."""
    import jax.stages

    from zoo.bench import flops

    x = jax.random.normal(jax.random.key(0), (2, 3, 6, 6, 6))
    task = Task(x, x, "mse")
    pair = {"linen-3d": _conv_subject((3, 3, 3), "linen-3d", task),
            "linen-int-kernel": _conv_subject(3, "linen-int-kernel", task)}

    def refused(source):
        with pytest.raises(FairnessError) as err:
            check_fairness(pair)
        entry = err.value.report["forward"]["flops"]["linen-int-kernel"]
        assert entry["source"] == source and 0.1 < entry["ratio"] < 0.2
        assert f"{entry['ratio']:.3f}x the" in str(err.value)
        assert f"{source} counts" in str(err.value)

    for broken in (None, {"flops": -1.0}, []):
        monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self, b=broken: b)
        refused("lowered")  # the backend's count of the pre-optimisation HLO
    monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", lambda self: None)
    refused("cpu")  # the same HLO counted by the host CPU client
    monkeypatch.setattr(flops, "_cpu_analysis", lambda lowered: [])
    with pytest.raises(FairnessError, match="no usable count for linen-3d from lowered or cpu"):
        check_fairness(pair)


class IntKernelConvT(nn.Module):
    """The published mistake on a conv-transpose: `kernel_size=3` on 3-D data."""

    features: int

    @nn.compact
    def __call__(self, x, *, train=False):
        return nn.ConvTranspose(self.features, 3, padding="SAME", name="convt")(x)


def test_cli_exits_nonzero_on_unfair_pair(monkeypatch, tmp_path, capsys):
    """Through the command line: status 3, the error names linen and its FLOPs, no record."""
    import zoo.bench.runner as runner

    real = runner.build_models

    def with_int_kernel(config, impls, seed=0, dtype="float32"):
        models = real(config, impls, seed, dtype)
        module = IntKernelConvT(config.out_channels)
        x = jnp.zeros((1, *config.spatial, config.in_channels))
        models["linen"] = module, jax.jit(module.init)(jax.random.key(0), x)
        return models

    monkeypatch.setattr(runner, "build_models", with_int_kernel)
    path = tmp_path / "unfair.json"
    status = cli.main([LAYER_ARCH, "--preset", "tiny", "--impl", "eqx,linen", "--mode",
                       "forward", "--config", '{"stride": 1, "output_padding": 0}',
                       "--json", str(path), "--no-progress"])
    assert status == cli.EXIT_UNFAIR
    err = capsys.readouterr().err
    err = " ".join(err.split())  # folded at 80 columns
    assert "unfair comparison refused" in err
    assert "FLOPs (forward): linen is counted at" in err and "below the" in err
    assert not path.exists()


def test_programs_below_the_useful_flops_are_refused_even_when_they_agree():
    """Two copies of one program agree with each other; a floor above their count (the useful
    work of the shape) still refuses them: agreeing on too little work is no defence."""
    x = jax.random.normal(jax.random.key(0), (2, 3, 6, 6, 6))
    task = Task(x, x, "mse")
    pair = {"a": _conv_subject((3, 3, 3), "a", task), "b": _conv_subject((3, 3, 3), "b", task)}
    counted = check_fairness(pair)["forward"]["flops"]["a"]["flops"]
    assert check_fairness(pair, flops_floor={"forward": counted})["passed"]
    with pytest.raises(FairnessError, match=r"a is counted at .* below the .* useful FLOPs"):
        check_fairness(pair, flops_floor={"forward": 2 * counted})


def test_the_timed_check_is_one_pass_at_the_timed_precision(monkeypatch):
    """`strict=False` (`--check timed`, the GPU run's): outputs and FLOPs checked once, at the
    precision timed, with that format's tolerance (TF32 on a GPU: one compilation per program),
    and the int-kernel pair is still refused."""
    from zoo.bench import fairness as fairness_mod

    x = jax.random.normal(jax.random.key(0), (2, 3, 6, 6, 6))
    task = Task(x, x, "mse")
    pair = {"a": _conv_subject((3, 3, 3), "a", task), "b": _conv_subject((3, 3, 3), "b", task)}
    compiled: list[str] = []
    real = fairness_mod._check_mode
    monkeypatch.setattr(fairness_mod, "_check_mode", lambda *a, **k: (
        compiled.append(a[1]) or real(*a, **k)))
    as_on_a_gpu = policy.compute_format  # float32 at "default" is TF32 there
    monkeypatch.setattr(policy, "compute_format", lambda d, p="highest", b=None: as_on_a_gpu(
        d, p, "gpu"))
    strict = check_fairness(pair, precision="default")
    assert compiled == ["forward", "forward"] and strict["check"] == "strict"
    compiled.clear()
    report = check_fairness(pair, precision="default", strict=False)
    assert report["check"] == "timed" and report["precision"] == "default"
    assert report["output_tolerance"] == policy.tolerance("float32", "default",
                                                          kind="max_relative", backend="gpu")
    assert report["output_tolerance"] > strict["output_tolerance"]
    assert compiled == ["forward"] and report["forward"]["flops"]["b"]["ok"]
    with pytest.raises(FairnessError, match="linen-int-kernel counts"):
        check_fairness({"linen-3d": pair["a"],
                        "linen-int-kernel": _conv_subject(3, "linen-int-kernel", task)},
                       precision="default", strict=False)


def test_loop_flops_count_every_trip():
    """XLA's cost analysis counts a loop body once; `flops.count` adds the other trips of its
    dots (nested loops multiplied through), so a scanned program counts as its unrolled twin."""
    from zoo.bench import flops

    a, b = jnp.ones((6, 16, 32)), jnp.ones((32, 8))
    matmul = 2 * 6 * 16 * 32 * 8

    def counted(fn):
        lowered = jax.jit(fn).lower(a, b)
        return {s: v[0] for s, v in flops.count(lowered, lowered.compile()).items()}

    scanned = counted(lambda a, b: jax.lax.scan(lambda c, ai: (c, ai @ b), None, a)[1])
    nested = counted(lambda a, b: jax.lax.scan(
        lambda c, ai: (c, jax.lax.scan(lambda c2, r: (c2, r @ b), None, ai.reshape(4, 4, 32))[1]),
        None, a)[1])
    unrolled = counted(lambda a, b: jnp.stack([ai @ b for ai in a]))
    for counts in (scanned, nested):
        for source in ("compiled", "lowered"):  # trips read from each program's own HLO
            # tolerance: FLOP counts, not floats: the loops' index arithmetic adds a few
            assert counts[source] == pytest.approx(unrolled[source], rel=0.01)
            assert counts[source] >= matmul
    assert flops.loop_flops("ENTRY %main () -> f32[] {\n  ROOT %c = f32[] constant(0)\n}") == 0


def test_fairness_checks_outputs_and_flops_units():
    ok, problems = fairness.compare_flops({"a": 100.0, "b": 100.5})
    assert not problems and ok["b"]["ok"] and ok["b"]["source"] == "lowered"
    # A program without a usable count is refused, not skipped (it could be anything).
    for missing in (None, -1.0, 0.0, float("nan")):
        ok, problems = fairness.compare_flops({"a": 100.0, "b": 100.5, "c": missing})
        assert problems == ["FLOPs (forward): no usable count for c from lowered or cpu: "
                            "the work cannot be checked"]
    # Counts are compared on a pre-optimisation source every program has; the compiled
    # count is kept as information, never compared.
    ok, problems = fairness.compare_flops({"a": {"compiled": 50.0, "lowered": 100.0},
                                           "b": {"cpu": 100.1, "lowered": 100.2}})
    assert not problems and ok["a"]["source"] == "lowered" and ok["a"]["flops"] == 100.0
    assert ok["a"]["counts"]["compiled"] == 50.0
    _, problems = fairness.compare_flops({"a": {"compiled": 100.0}, "b": {"lowered": 100.0}})
    assert problems == ["FLOPs (forward): no usable count for a from lowered or cpu: the work "
                        "cannot be checked"]
    _, problems = fairness.compare_flops({"a": 100.0, "b": 102.0})
    assert problems and "1.020x" in problems[0]
    ref = np.linspace(-1, 1, 50)
    _, problems = fairness.compare_outputs({"a": ref, "b": ref + 1e-6}, 1e-4)
    assert not problems
    _, problems = fairness.compare_outputs({"a": ref, "b": ref[:10]}, 1e-4)
    assert "shape" in problems[0]


def test_fairness_bfloat16_with_torch():
    """bf16 models of every library agree within the bf16 tolerance (forward and loss)."""
    spec = build_config(LAYER_ARCH, find_preset("tiny", LAYER_ARCH).config, "lhs_dilation")
    task = make_task(spec, 2, dtype="bfloat16")
    models = build_models(spec, IMPLS, dtype="bfloat16")
    report = check_fairness({i: Subject(i, m, task) for i, m in models.items()},
                            ("forward",), dtype="bfloat16")
    assert report["passed"] and report["output_tolerance"] == fairness.output_tolerance(
        "bfloat16")


def test_bfloat16_cnn_batch_norm_compiles_to_the_same_flops():
    """In bfloat16 the zoo's Equinox BatchNorm normalises as Flax's does (batch statistics in
    float32, the stored ones as they are): the programs count the same FLOPs (they once
    differed by 11% at inference, and the benchmark refused to run)."""
    config = zoo.tiny_config("cnn")
    task = make_task(config, 4, dtype="bfloat16")
    models = build_models(config, zoo.JAX_IMPLS, dtype="bfloat16")
    report = check_fairness({i: Subject(i, m, task) for i, m in models.items()},
                            ("forward",), dtype="bfloat16")
    flops = {name: e["flops"] for name, e in report["forward"]["flops"].items()}
    assert report["passed"] and set(flops) == set(zoo.JAX_IMPLS)
    assert max(flops.values()) <= (1 + fairness.FLOPS_TOLERANCE) * min(flops.values())


# --------------------------------------------------------------------------- presets, options
def test_presets():
    assert {p.arch for p in PRESETS if p.name == "tiny"} == set(ARCHS)
    big = find_preset("convt-256")
    spec = build_config(big.arch, big.config, "auto")
    assert (big.batch, *spec.input_shape) == (4, 4, 256, 256, 256)
    assert spec.output_shape == (4, 256, 256, 256)
    wgrad = find_preset("convt-wgrad")
    spec = build_config(wgrad.arch, wgrad.config, "auto")
    assert (wgrad.batch, *spec.input_shape) == (1, 64, 64, 64, 32)
    assert spec.output_shape == (1, 128, 128, 64)
    assert wgrad.dtype == "bfloat16" and wgrad.modes == ("train",)
    with pytest.raises(PresetError, match="name the architecture"):
        find_preset("tiny")
    with pytest.raises(PresetError, match="no preset"):
        find_preset("nope", "mlp")


def test_declared_presets_build_and_reach_the_gpu_matrix():
    """Presets and matrix runs come from the subjects' `BenchSpec`s (no subject is named in
    zoo.bench); each preset builds a valid config, each realistic size runs in the full
    matrix only, and every declared run names a preset of its subject."""
    from zoo.bench.matrix import plan
    from zoo.bench.presets import declared_presets
    from zoo.bench.spec import bench_archs, bench_spec

    assert set(bench_archs()) == set(zoo.ARCHS) | {LAYER_ARCH}
    for p in declared_presets():
        assert find_preset(p.name, p.arch) == p
        build_config(p.arch, p.config, "auto")
    full = [e.command for e in plan(quick=False, repeat=20)]
    quick = [e.command for e in plan(quick=True, repeat=2)]
    runs = [(a, r) for a in bench_archs() for r in bench_spec(a).matrix]
    assert {a for a, r in runs if r.realistic} >= {"resnet", "unet3d", "vit"}
    for arch, run in runs:
        find_preset(run.preset, arch)
        assert any(c.startswith(f"python -m zoo.bench {arch} --preset {run.preset} ")
                   for c in full)
        assert run.realistic != any(c.startswith(f"python -m zoo.bench {arch} --preset tiny "
                                                 f"{' '.join(run.args)}") for c in quick)
    assert not [e for e in plan(quick=True, repeat=2) if e.group == "presets"]


def test_a_bench_only_subject_declares_its_tiny_preset():
    from zoo.bench.spec import BenchSpec, register

    with pytest.raises(ValueError, match="'layer' is no zoo architecture: declare its 'tiny'"):
        register(BenchSpec("layer", presets=({"name": "big", "batch": 1},)))


def test_method_reaches_models():
    args = cli.bench_parser().parse_args(["decoder3d", "--preset", "tiny", "--method", "pad"])
    cfg = cli.config_from_args(args)
    assert build_config(cfg.arch, cfg.model_config, cfg.method).conv_method == "pad"
    args = cli.bench_parser().parse_args(["--preset", "convt-wgrad", "--method", "phase"])
    cfg = cli.config_from_args(args)
    assert cfg.arch == LAYER_ARCH and cfg.dtype == "bfloat16" and cfg.modes == ("train",)
    spec = build_config(cfg.arch, cfg.model_config, cfg.method)
    assert spec.method == "phase"
    module, _ = build_models(spec, ("linen",))["linen"]
    assert isinstance(module, LinenConvT) and module.config.method == "phase"
    assert resolve_calls("all", ("nnx",))["nnx"][0] == "nnx_jit"
    assert resolve_calls("default", ("eqx", "torch")) == {"eqx": ["fast"], "torch": ["eager"]}


def test_build_models_equals_zoo_create():
    config = build_config("mlp", find_preset("tiny", "mlp").config, "auto")
    shared = build_models(config, ("nnx",), seed=3)["nnx"]
    direct = zoo.create(config, "nnx", seed=3)
    _, a, _ = zoo.interface("nnx").split(shared)
    _, b, _ = zoo.interface("nnx").split(direct)
    assert all(np.array_equal(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b),
                                                    strict=True))


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
def test_torch_alone_gets_flops_from_a_jax_twin(tmp_path):
    path = tmp_path / "torch.json"
    assert cli.main(["mlp", "--preset", "tiny", "--impl", "torch", "--mode", "forward",
                     "--repeat", "2", "--warmup", "0", "--json", str(path),
                     "--no-progress"]) == 0
    (row,) = json.loads(path.read_text())["results"]
    assert row["flops_source"] == "eqx (JAX twin, lowered)" and row["flops"] > 0


def test_bad_arguments_exit_2():
    with pytest.raises(SystemExit) as e:
        cli.main(["mlp", "--impl", "jax"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["mlp", "--call", "filter_jit", "--impl", "linen"])
    assert e.value.code == 2


# --------------------------------------------------------------------------- dispatch, report
def test_dispatch_suite_and_report(tmp_path):
    """One quick round of the dispatch suite, then the report over it and a model record."""
    from zoo.bench import report

    results = tmp_path / "results"
    assert cli.main(["dispatch", "--workload", "identity", "--rounds", "2", "--budget", "0.002",
                     "--impl", "eqx,linen,nnx", "--record", "--results-dir", str(results),
                     "--no-progress"]) == 0
    device_dir = next(results.iterdir())
    record = json.loads((device_dir / "dispatch.json").read_text())
    calls = {(r["role"], r.get("impl"), r["call"]) for r in record["results"]}
    assert ("floor", None, "raw jax.jit, pre-flattened") in calls
    assert {("style", "eqx", "fast"), ("style", "eqx", "filter_jit"), ("style", "linen", "fast"),
            ("style", "nnx", "nnx_jit"), ("style", "nnx", "fast")} <= calls
    assert set(record["summary"]) == set(zoo.JAX_IMPLS)
    floor = next(r for r in record["results"] if r["role"] == "floor")
    assert floor["ratio_to_floor"] == 1.0

    assert cli.main(["mlp", "--preset", "tiny", "--impl", "eqx,nnx", "--mode", "forward",
                     "--repeat", "2", "--warmup", "0", "--record", "--results-dir",
                     str(results), "--no-progress"]) == 0
    readme, plots = tmp_path / "README.md", tmp_path / "plots"
    assert cli.main(["report", "--results", str(results), "--readme", str(readme),
                     "--plots", str(plots)]) == 0
    text = readme.read_text()
    assert "### Dispatch overhead" in text and "### mlp forward: preset `tiny`, batch 4" in text
    assert "| eqx | **fast** |" in text
    pngs = sorted(p.name for p in plots.iterdir())
    assert any(p.endswith("dispatch.png") for p in pngs)
    assert any("mlp-tiny" in p for p in pngs)
    assert report.load_records(str(results))


# --------------------------------------------------------------------------- methods, roofline
def test_method_all_rows_ratios_and_roofline(tmp_path):
    """`--method all` on the tiny convt: one row per (impl, method) and PyTorch, in one record,
    with the × lhs_dilation, × torch and × roofline columns; FLOPs compared per method."""
    from zoo.bench.runner import ALL_METHODS

    path = tmp_path / "methods.json"
    assert cli.main([LAYER_ARCH, "--preset", "tiny", "--impl", "all", "--method", "all",
                     "--mode", "forward", "--repeat", "2", "--warmup", "0", "--rounds", "1",
                     "--json", str(path), "--no-progress"]) == 0
    record = json.loads(path.read_text())
    assert record["config"]["methods"] == list(ALL_METHODS)
    # 3-D, stride 2: im2col on CPU, phase elsewhere
    assert record["config"]["auto_picks"] == [
        "im2col" if jax.default_backend() == "cpu" else "phase"]
    assert record_name(record).endswith("-methods.json")
    rows = record["results"]
    jax_impls = [i for i in IMPLS if i != "torch"]
    got = {(r["impl"], r["method"]) for r in rows}
    want = {(i, m) for i in jax_impls for m in ALL_METHODS}
    if HAVE_TORCH:
        want.add(("torch", None))
    assert got == want
    roof = record["roofline"]["forward"]
    assert roof["flops"] == 2 * 2 * 4 * 4 * 11 ** 3 and roof["time_s"] > 0
    for r in rows:
        assert r["ratio_to_roofline"] == pytest.approx(r["time"]["median_s"] / roof["time_s"])
        if r["impl"] == "torch":
            assert "ratio_to_lhs_dilation" not in r
            continue
        base = next(b for b in rows if (b["impl"], b["method"]) == (r["impl"], "lhs_dilation"))
        assert r["ratio_to_lhs_dilation"] == pytest.approx(
            r["time"]["median_s"] / base["time"]["median_s"])
        if HAVE_TORCH:
            assert r["ratio_to_torch"] > 0
    flops = record["fairness"]["forward"]["flops"]
    assert {e["group"] for name, e in flops.items() if name != "torch"} == set(ALL_METHODS)
    from zoo.bench.tables import model_table, to_markdown

    lines = "\n".join(to_markdown(model_table(record, "forward", wide=True)))
    assert "× lhs_dil" in lines and "| phase |" in lines


def test_convt_roofline_hand_computed():
    from zoo.bench.roofline import convt_roofline

    # 2 x 3 -> 5 channels, k3 s1 p0 on 4^3 -> 6^3: no tap is cropped.
    r = convt_roofline(2, 3, 5, (4, 4, 4), 3, 1, 0, 0)
    assert r.flops == 2 * 2 * 3 * 5 * 27 * 64
    x, w, y = 2 * 3 * 64, 3 * 5 * 27 + 5, 2 * 5 * 6 ** 3
    assert r.bytes == 4 * (x + w + y)
    assert r.time_s(1e9, 1e6) == pytest.approx(4 * (x + w + y) / 1e6)  # memory-bound
    assert r.time_s(1e3, 1e12) == pytest.approx(r.flops / 1e3)  # compute-bound
    assert r.time_s(None, None) is None
    t = convt_roofline(2, 3, 5, (4, 4, 4), 3, 1, 0, 0, mode="train", itemsize=2)
    assert t.flops == 2 * r.flops and t.bytes == 2 * (x + 2 * w + y)
    ti = convt_roofline(2, 3, 5, (4, 4, 4), 3, 1, 0, 0, mode="train", input_grad=True)
    assert ti.flops == 3 * r.flops and ti.bytes == 4 * (2 * x + 2 * w + y)
    # k3 s2 p1 op1 on 4 -> 8: of the 12 (input, tap) pairs one lands at -1 (cropped).
    assert convt_roofline(1, 1, 1, (4,), 3, 2, 1, 1, bias=False).flops == 2 * 11


def test_parse_methods_and_new_presets():
    from zoo.bench.runner import parse_methods

    assert parse_methods("all") == ("lhs_dilation", "pad", "phase", "phase_batched", "im2col",
                                      "auto")
    assert parse_methods("phase, pad,phase") == ("phase", "pad")
    with pytest.raises(ValueError, match="unknown conv-transpose method"):
        parse_methods("fft")
    with pytest.raises(SystemExit) as e:
        cli.main([LAYER_ARCH, "--preset", "tiny", "--method", "fft"])
    assert e.value.code == 2
    small = find_preset("convt-256-cpu")
    spec = build_config(small.arch, small.config, "auto")
    assert (small.batch, *spec.input_shape) == (1, 4, 64, 64, 64)
    assert (spec.kernel_size, spec.stride, spec.padding) == (3, 1, 1)
    wg = build_config(LAYER_ARCH, find_preset("convt-wgrad-cpu").config, "auto")
    assert (wg.in_channels, wg.out_channels, wg.stride, wg.output_padding) == (64, 1, 2, 1)
    dec = find_preset("decoder3d-train")
    assert dec.arch == "decoder3d" and dec.batch == 2 and dec.modes == ("train",)


# --------------------------------------------------------------------------- steps per call, flags
class FakeClock:
    """`time.perf_counter` for `zoo.bench.timing`: it moves only when a call under test `work`s,
    so the timing logic is checked by counts, not by the machine's load."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def work(self, seconds: int) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    from zoo.bench import timing

    fake = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", fake)
    return fake


def test_fused_calls_are_timed_per_step(clock):
    """A call of K steps is recorded as K steps: per-step times are call time / K."""
    from zoo.bench.timing import Prepared, run_steps

    samples = run_steps(Prepared(lambda: clock.work(8), block=lambda out: out, steps=4), 2)
    assert samples.step_s == [2, 2] and samples.dispatch_s == [2, 2]


def test_settle_calls_until_the_time_has_passed(clock):
    """Settling runs untimed calls until the given time has passed, and at least one."""
    from zoo.bench.timing import Prepared, settle

    calls = []
    prepared = Prepared(lambda: (clock.work(1), calls.append(clock())), block=lambda out: out)
    assert settle(prepared, 0.0) == 1 and calls == [1]
    calls.clear()
    assert settle(prepared, 3.5) == 4 and calls == [2, 3, 4, 5]  # stopped at the first past it


def test_round_orders_give_every_key_every_neighbour():
    """Seeded shuffles: each round is a permutation, the same seed the same orders, and every
    key comes right after every other (a rotation keeps one fixed predecessor per key)."""
    from zoo.bench.timing import round_orders

    keys = ["eqx", "linen", "nnx", "torch"]
    orders = round_orders(keys, 40, seed=0)
    assert all(sorted(o) == sorted(keys) for o in orders)
    assert orders == round_orders(keys, 40, seed=0) != round_orders(keys, 40, seed=1)
    flat = [k for o in orders for k in o]
    pairs = {(a, b) for a, b in itertools.pairwise(flat) if a != b}
    assert pairs == {(a, b) for a in keys for b in keys if a != b}


def test_round_ratios_pair_each_round():
    """A machine that slows down tenfold during the run: the paired ratio stays exact."""
    from zoo.bench.timing import round_ratios

    slow = [[r * 1.0, r * 1.0] for r in range(1, 11)]
    ratios = round_ratios({"a": slow, "b": [[1.1 * t for t in r] for r in slow]}, "a")
    assert ratios["a"] == {"median": 1.0, "p10": 1.0, "p90": 1.0, "rounds": 10}
    assert all(ratios["b"][k] == pytest.approx(1.1) for k in ("median", "p10", "p90"))


def test_dispatch_training_rows(tmp_path):
    """The training workload's rows of one library: every style, zoo.runtime.fast at K = 1, 10,
    100."""
    from zoo.bench import dispatch
    from zoo.bench.subjects import Subject, build_models, make_task

    config = zoo.tiny_config("mlp")
    subject = Subject("eqx", build_models(config, ("eqx",))["eqx"], make_task(config, 1))
    entries, own = dispatch._entries("eqx", subject, "train")
    style = {call: dispatch.Row("style", call, "eqx")
             for call in ("filter_jit", "fast", "fused K=10", "fused K=100")}
    assert own == dispatch.Row("own", dispatch.OWN, "eqx")
    assert {own, *style.values()} <= set(entries)
    assert [entries[style[f"fused K={k}"]].steps for k in (10, 100)] == [10, 100]
    samples = dispatch.interleaved({style[k]: entries[style[k]] for k in ("fast", "fused K=100")},
                                   1, 0.001)
    assert all(len(v) >= 5 for v in samples.values())


def test_optimizer_bound_is_the_adam_update_alone():
    """The dispatch suite's lower bound for fused training runs exactly K Adam updates with
    fixed gradients per call (what any fused step must at least do), timed per step."""
    import optax

    from zoo.bench import dispatch

    leaves = [jnp.arange(6.0).reshape(2, 3), jnp.ones(3)]
    bound = dispatch._optimizer_bound(leaves, 3)
    assert bound.steps == 3
    params, _ = bound.fn(*bound.args)
    tx, want = optax.adam(dispatch.LEARNING_RATE), leaves
    opt = tx.init(want)
    for _ in range(3):
        updates, opt = tx.update([jnp.full_like(a, 1e-3) for a in want], opt, want)
        want = optax.apply_updates(want, updates)
    for got, ref in zip(params, want, strict=True):
        assert_close(got, ref)
    assert not np.allclose(params[0], leaves[0])
    _, _, bounds = dispatch.workload("mlp_train", ("eqx",))
    assert [b.steps for b in bounds.values()] == [max(dispatch.FUSED_STEPS)]
    assert [row.role for row in bounds] == ["bound"]


def test_steps_per_call_and_xla_flags_bad_input(capsys):
    from zoo.bench import xla_flags

    for argv in (["mlp", "--steps-per-call", "0"], ["mlp", "--xla-cpu-flags", "fastest"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
    assert "--steps-per-call: expected an int >= 1" in capsys.readouterr().err.replace(
        "argument ", "")
    assert xla_flags.resolve("onednn") == xla_flags.PRESETS["onednn"]
    assert xla_flags.resolve(" --xla_cpu_use_xnnpack=true ") == "--xla_cpu_use_xnnpack=true"
    # This process has started JAX's backend: flags can no longer apply, so apply refuses.
    jax.devices()
    with pytest.raises(xla_flags.XlaFlagsError, match="already initialised"):
        xla_flags.apply("none")


def test_xla_flag_probe_rejects_unknown_flags():
    """XLA aborts on an unknown flag: the probe (a subprocess) reports it instead."""
    from zoo.bench import xla_flags

    assert "Unknown flag" in xla_flags.probe("--xla_zoo_no_such_flag=true")


def test_every_subcommand_is_a_function_of_the_rest_of_the_line(capsys):
    """`python -m zoo.bench NAME ...`: each name of the table resolves to its function, which
    gets the rest of the command line (`--help` of each exits cleanly, naming its command);
    a name not in the table is a subject (`gpt2`), never a subcommand."""
    import importlib

    for name, target in cli.SUBCOMMANDS.items():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), name
        with pytest.raises(SystemExit) as done:
            cli.main([name, "--help"])
        assert done.value.code == 0 and f"zoo.bench {name}" in capsys.readouterr().out, name
    assert not set(cli.SUBCOMMANDS) & set(ARCHS)


@pytest.mark.parametrize("name", ["gpt2", "llama-3.2-1b", "gemma-2b", "phi-3-mini-4k",
                                  "mixtral-8x7b-v0.1", "qwen3-30b-a3b"])
def test_decoder_flops_are_each_familys_count_from_its_own_fields(name):
    """The one FLOP floor of the decoder-only families (read from the body's spec) equals
    each family's count written from its config's own field names."""
    from zoo.bench.spec import decoder_flops

    c = zoo.make_config(name)
    if c.arch == "gpt2":
        e, layers, vocab = c.n_embd, c.n_layer, c.vocab_size
        q = kv = e
        mlp = 2 * c.inner
    else:
        e, layers, vocab = c.hidden_size, c.num_hidden_layers, c.vocab_size
        d = e // c.num_attention_heads if getattr(c, "head_dim", None) is None else c.head_dim
        q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
        mlp = 3 * c.intermediate_size
        if c.arch == "mixtral":  # every layer sparse: the router and each token's top-k experts
            width = c.moe_intermediate_size or c.intermediate_size
            mlp = c.num_local_experts + c.num_experts_per_tok * 3 * width
    t = c.length
    forward = 2 * (layers * (2 * t * e * (2 * q + 2 * kv + mlp) + 2 * 2 * t * t * q)
                   + 2 * t * e * vocab)
    assert decoder_flops(c, 2, "forward") == forward
    assert decoder_flops(c, 2, "train") == 3 * forward


def test_the_committed_report_names_every_committed_record():
    """bench/README.md is `zoo.bench report`'s rendering of bench/results/: each record it
    renders (model and dispatch) is named there, shown or superseded. A record committed
    without running the report (as the H100 CNN record once was) fails here."""
    from pathlib import Path

    from zoo.bench.report import load_records

    bench = Path(__file__).resolve().parents[1] / "bench"
    readme = (bench / "README.md").read_text()
    missing = [str(Path(p).relative_to(bench)) for p, _ in load_records(str(bench / "results"))
               if str(Path(p).relative_to(bench)) not in readme]
    assert not missing, f"run python -m zoo.bench report: bench/README.md lacks {missing}"
