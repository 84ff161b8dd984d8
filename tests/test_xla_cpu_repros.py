"""zoo.bench.investigations.xla_cpu: the XLA:CPU facts its reproductions show, pinned on the
jaxlib of requirements/constraints.txt (counts read off the compiled HLO, independent of load; a
failure names the pinned and the installed versions), and its command line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ELEMENTAL_EMITTER, UNOPTIMIZED
from zoo.bench.investigations import xla_cpu
from zoo.bench.xla_flags import PRESETS

pytestmark = pytest.mark.cpu_only(reason="facts of XLA:CPU's compiler")


@pytest.mark.pinned("jax", "jaxlib")
def test_concatenate_operands_are_written_by_separate_fusions():
    """The 9 shifted slices of a 3x3 im2col are each materialised, then concatenated."""
    assert xla_cpu.concatenate_fusions((2, 5, 10, 10, 4)) == (9, 9)


@pytest.mark.pinned("jax", "jaxlib")
def test_residual_stack_fusion_operands_grow_faster_than_depth():
    """Autodiff's LayerNorm chain: more than twice the operands for twice the depth (the
    closed form's halving is pinned in tests/test_layer_norm.py)."""
    auto = [xla_cpu.fusion_operands(d, (4, 5, 16))[0] for d in (2, 4, 8)]
    assert auto[2] / auto[1] > 2.2 and auto[1] / auto[0] > 2.2, auto


@pytest.mark.pinned("jax", "jaxlib")
def test_channels_first_convolution_is_wrapped_in_transposes():
    first = xla_cpu.conv_transposes(("NCHW", "OIHW", "NCHW"))
    assert first >= 2 and xla_cpu.conv_transposes(("NHWC", "HWIO", "NHWC")) == 0, first



@pytest.mark.pinned("jax", "jaxlib")
def test_a_stored_out_in_weight_is_transposed_before_the_product():
    """Why Flax's decoding cannot keep PyTorch's (out, in) weights and read them as
    `x @ w.T`: the transpose is materialised, not folded into the product."""
    assert xla_cpu.transpose_kept()


@pytest.mark.pinned("jax", "jaxlib")
def test_a_column_major_kernel_is_copied_to_row_major_before_the_product():
    """Why Flax's kernels cannot simply be laid out as PyTorch's weights for decoding
    (`jax.experimental.layout`): XLA:CPU copies them back first."""
    assert xla_cpu.column_major_copied()


@pytest.mark.pinned("jax", "jaxlib")
def test_a_bfloat16_weight_is_converted_whole_before_the_product():
    """Why bfloat16 decoding is slower than float32 on XLA:CPU: no bfloat16 matrix-vector
    product, each weight converted to a float32 copy at every call."""
    assert xla_cpu.weight_converted()


@pytest.mark.pinned("jax", "jaxlib")
def test_a_kv_cache_is_transposed_or_copied_whole_at_every_decode_step():
    """Why the zoo's KV caches stay slot-major `(N, L, heads, D)`: in a decode loop XLA:CPU
    transposes such a cache once a step for the attention's products; head-major, which those
    products read as it lies, it is copied whole several times a step instead."""
    assert xla_cpu.cache_loop_ops(head_major=False) == (0, 1)
    copies, transposes = xla_cpu.cache_loop_ops(head_major=True)
    assert transposes == 0 and copies > 1, (copies, transposes)


_YNN_PROBE = """
import jax, jax.numpy as jnp
from jax import lax
x, w = jnp.ones((32, 32, 32, 64)), jnp.ones((3, 3, 64, 64))
conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
hlo = jax.jit(conv).lower(x, w).compile().as_text()
print(sum("ynn_fusion" in ln and " fusion(" in ln for ln in hlo.splitlines()))
"""


@pytest.mark.parametrize(("preset", "ynn_fusions"), [("none", 1), ("eigen-conv", 0)])
@pytest.mark.pinned("jax", "jaxlib")
def test_eigen_conv_preset_takes_convolutions_from_ynnpack(preset, ynn_fusions):
    """XLA's default runs ResNet-18's 64-channel 32x32 convolution as a YNNPACK fusion; the
    preset's flag gives it back to XLA's own convolution (compiled only, in a fresh process:
    XLA reads its flags once)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": PRESETS[preset],
           "PYTHONPATH": os.pathsep.join(sys.path), "JAX_DISABLE_MOST_OPTIMIZATIONS": "false"}
    out = subprocess.run([sys.executable, "-c", _YNN_PROBE], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert int(out[-1]) == ynn_fusions


def test_command_prints_a_reproduction(capsys):
    assert xla_cpu.xla_cpu_main(["--only", "nchw-conv", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "nchw-conv: XLA:CPU's convolutions are channels-last" in out
    assert "NCHW/OIHW" in out and "upstream:" in out
    assert max(len(line) for line in out.splitlines()) <= 80


@pytest.mark.parametrize(("argv", "message"), [
    (["--only", "concatenate,bogus"], "unknown --only ['bogus']"),
    (["--rounds", "0"], "--rounds: expected an int >= 1, got '0'"),
])
def test_command_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        xla_cpu.xla_cpu_main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.pinned("jaxlib")
def test_the_suite_compiles_with_the_elemental_emitter():
    """The suite's processes, and the fresh interpreters its tests start, compile with XLA:CPU's
    elemental emitter (tests/conftest.py; its MLIR fusion emitters took 2-4x the compile time on
    the suite's tiny programs), a flag this jaxlib knows: XLA aborts a process on one it does
    not."""
    if not UNOPTIMIZED:
        pytest.skip("ZOO_TEST_OPTIMIZED=1: the default emitters")
    assert ELEMENTAL_EMITTER in os.environ["XLA_FLAGS"].split()
    code = "import jax, os; jax.devices(); print(os.environ['XLA_FLAGS'])"
    started = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert ELEMENTAL_EMITTER in started.stdout.split()
