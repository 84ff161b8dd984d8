"""Runs on GPU by construction: every benchmark subject (each zoo architecture and the
bench-only ones, tiny preset, every conv-transpose method) lowers for CUDA on this CPU machine,
forward and training step, in every JAX library: `jax.export` needs no GPU and refuses
CPU-only operations and custom calls."""

from __future__ import annotations

from typing import Any

import jax
import pytest

import zoo
from zoo.bench.presets import find_preset
from zoo.bench.spec import bench_archs
from zoo.bench.subjects import Subject, build_config, build_models, make_task
from zoo.layers.conv_transpose import METHODS


def _export(config: Any, batch: int) -> None:
    """Export the forward pass and the training step of `config` in every JAX library."""
    task = make_task(config, batch)
    for impl, native in build_models(config, tuple(zoo.JAX_IMPLS)).items():
        subject = Subject(impl, native, task)
        fwd = subject.fast_forward()
        exported = jax.export.export(fwd.jitted, platforms=["cuda"])(*fwd.args, subject.x)
        assert exported.platforms == ("cuda",)
        step = subject.fast_train()
        exported = jax.export.export(step.jitted, platforms=["cuda"])(
            *step.leaves, *subject.train_args())
        assert exported.platforms == ("cuda",)
        assert exported.out_avals[-1].shape == ()  # the loss


@pytest.mark.whole_model
@pytest.mark.parametrize("arch", bench_archs())
def test_every_subject_exports_for_cuda(arch):
    """Each subject's tiny preset, conv-transposes by the "auto" method (what users run); a
    CUDA lowering is per layer kind: the kind cover's architectures (--exhaustive: every one)."""
    preset = find_preset("tiny", arch)
    _export(build_config(arch, preset.config, "auto"), preset.batch)


@pytest.mark.parametrize("method", METHODS)
def test_every_conv_transpose_method_exports_for_cuda(method):
    """"auto" picks a method per platform: each one lowers for CUDA (on the one-layer subject)."""
    preset = find_preset("tiny", "convt")
    _export(build_config("convt", preset.config, method), preset.batch)


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape")
                        else a, tree)


def test_the_gpu_runs_models_lower_for_cuda_at_full_size(monkeypatch):
    """What `python -m zoo.bench gpu` runs, traced as on the GPU (the layers' choices read the
    backend: no im2col, `auto` picks the GPU's method) at the full size, with abstract inputs
    (and weights where no training step needs them): the seed's conv-transpose at (4, 4, 256^3)
    with every method, forward and training step, and the presets' forward passes."""
    from zoo.bench import gpu
    from zoo.bench.subjects import Task
    from zoo.runtime import fast

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    seed = find_preset("convt-256", "convt")
    for method in METHODS:
        config = build_config("convt", seed.config, method)
        x = jax.ShapeDtypeStruct((seed.batch, *config.input_shape), "float32")
        y = jax.ShapeDtypeStruct((seed.batch, *config.output_shape), "float32")
        for impl, native in build_models(config, tuple(zoo.JAX_IMPLS)).items():
            to_native = zoo.interface(impl).to_native
            xs, ys = jax.eval_shape(to_native, x), jax.eval_shape(to_native, y)
            subject = Subject(impl, native, Task(x, y, "mse"))
            fwd = subject.fast_forward()
            jax.export.export(fwd.jitted, platforms=["cuda"])(*fwd.args, xs)
            step = subject.fast_train()
            exported = jax.export.export(step.jitted, platforms=["cuda"])(*step.leaves, xs, ys)
            assert exported.out_avals[-1].shape == ()
    for arch, name, *_ in gpu.MODEL_PRESETS:
        preset = find_preset(name, arch)
        config = build_config(preset.arch, preset.config, "auto")
        x = jax.ShapeDtypeStruct((preset.batch, *config.input_shape), "float32")
        for impl in zoo.JAX_IMPLS:
            fwd = fast.forward(zoo.skeleton(config, impl, "float32"), impl)
            xs = jax.eval_shape(zoo.interface(impl).to_native, x)
            exported = jax.export.export(fwd.jitted, platforms=["cuda"])(*_abstract(fwd.args),
                                                                         xs)
            assert exported.platforms == ("cuda",), (name, impl)
