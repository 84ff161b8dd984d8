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


@pytest.mark.parametrize("arch", bench_archs())
def test_every_subject_exports_for_cuda(arch):
    """Each subject's tiny preset, conv-transposes by the "auto" method (what users run)."""
    preset = find_preset("tiny", arch)
    _export(build_config(arch, preset.config, "auto"), preset.batch)


@pytest.mark.parametrize("method", METHODS)
def test_every_conv_transpose_method_exports_for_cuda(method):
    """"auto" picks a method per platform: each one lowers for CUDA (on the one-layer subject)."""
    preset = find_preset("tiny", "convt")
    _export(build_config("convt", preset.config, method), preset.batch)
