"""The precision policy: compute formats, the one tolerance formula, applying and restoring."""

from __future__ import annotations

import subprocess
import sys

import jax
import numpy as np
import pytest

from zoo.runtime import precision
from zoo.testing import assert_close, tolerance


def test_compute_format_per_backend():
    f = precision.compute_format
    assert [f("float32", p, "gpu") for p in precision.PRECISIONS] == ["tf32", "tf32", "float32"]
    assert [f("float32", p, "cpu") for p in precision.PRECISIONS] == ["float32"] * 3
    assert [f("float32", p, "tpu") for p in precision.PRECISIONS] == ["bfloat16", "tf32",
                                                                       "float32"]
    assert f("bfloat16", "highest", "gpu") == "bfloat16" and f("float16", "default") == "float16"
    with pytest.raises(ValueError, match="precision must be one of default, high, highest"):
        f("float32", "fast")


def test_tolerances_come_from_the_mantissa():
    """tol = r * eps(format) + a * eps(float32 accumulator), eps = 2^-mantissa bits."""
    for kind, k in precision.KINDS.items():
        for fmt_dtype, precision_, backend, bits in (("float32", "highest", "gpu", 23),
                                                     ("float32", "default", "gpu", 10),
                                                     ("bfloat16", "highest", "cpu", 7),
                                                     ("float16", "highest", "cpu", 10)):
            want = k.rounding * 2.0 ** -bits + k.accumulation * 2.0 ** -23
            assert precision.tolerance(fmt_dtype, precision_, kind=kind,
                                       backend=backend) == pytest.approx(want)
    # What the tests and the fairness check use at full float32 (~1e-5 and ~1e-4).
    assert tolerance("float32") == precision.allclose("float32")
    assert 0.9e-5 < tolerance("float32")["rtol"] < 1.1e-5
    assert 0.9e-4 < precision.tolerance("float32", kind="max_relative") < 1.1e-4


def test_assert_close_scales_by_the_array_not_the_element():
    """Issue 52's failure: a gradient whose entries reach ~15 differs by 2.6e-6 at an entry of
    0.148 (reduction order). Judged against that entry (rtol 1e-5, atol 1e-6) it failed; against
    the array's scale it is float32 noise. A real 1e-4 relative error still fails, and leaves are
    named."""
    want = np.array([[15.0, 0.14845756, -3.0]], np.float32)
    got = want.copy()
    got[0, 1] = 0.14845499
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # tolerance: issue 52's
    assert_close(got, want)
    wrong = want * np.float32(1 + 1e-4)
    with pytest.raises(AssertionError, match="grads"):
        assert_close(wrong, want, err_msg="grads")
    with pytest.raises(AssertionError, match=r"\['b'\]"):
        assert_close({"a": want, "b": wrong}, {"a": want, "b": want})
    # The same leaves, not only as many: a key missing on one side is named.
    with pytest.raises(AssertionError, match=r"only in actual \['c'\].*only in desired \['b'\]"):
        assert_close({"a": want, "c": want}, {"a": want, "b": want})
    assert_close([want, want], (want, want))
    # Small arrays keep an absolute floor of one tolerance (scale at least 1).
    with pytest.raises(AssertionError):
        assert_close(np.float32(1e-3), np.float32(0.0))
    assert_close(np.float32(1e-6), np.float32(0.0))
    # TF32 earns the tolerance of its 10-bit mantissa, ~390x float32's.
    ratio = (precision.tolerance("float32", "default", backend="gpu")
             / precision.tolerance("float32", "highest", backend="gpu"))
    assert 300 < ratio < 500
    with pytest.raises(ValueError, match="kind must be one of"):
        precision.tolerance("float32", kind="loose")
    with pytest.raises(ValueError, match="dtype 'int32' has no tolerance"):
        precision.tolerance("int32")


def test_use_sets_and_restores_jax_and_torch():
    pytest.importorskip("torch")
    before = precision.current()
    with precision.use("high"):
        now = precision.current()
        assert now["jax_default_matmul_precision"] == "high"
        assert set(now["torch"].values()) <= {"tf32", True}
    with precision.exact():
        now = precision.current()
        assert now["jax_default_matmul_precision"] == "highest"
        assert set(now["torch"].values()) <= {"ieee", False}
        # The setting reaches jitted programs: highest is part of what XLA is asked for.
        text = jax.jit(lambda a: a @ a).lower(np.ones((2, 2), np.float32)).as_text()
        assert "HIGHEST" in text
    with precision.use("default"):
        assert precision.current() == before
    assert precision.current() == before


def test_the_suite_runs_at_full_float32_and_subprocesses_inherit_it():
    """conftest applies the policy: JAX here and in subprocesses (examples) at highest."""
    assert jax.config.jax_default_matmul_precision == precision.EXACT
    out = subprocess.run([sys.executable, "-c", "import jax; "
                          "print(jax.config.jax_default_matmul_precision)"],
                         capture_output=True, text=True, timeout=120).stdout.strip()
    assert out == precision.EXACT


def test_a_pinned_fact_names_the_pinned_and_the_installed_versions(monkeypatch):
    from zoo import testing

    pinned = testing.pins()
    assert pinned["jaxlib"] == "0.10.2" and pinned["torch"] == "2.14.1"
    with testing.pinned_fact("jaxlib"):
        pass
    monkeypatch.setattr(testing, "_installed", lambda package: "0.11.0")
    message = r"^fact pinned at jaxlib 0\.10\.2 no longer holds on jaxlib 0\.11\.0: fused 9$"
    with pytest.raises(AssertionError, match=message), testing.pinned_fact("jaxlib"):
        raise AssertionError("fused 9")
