"""`python -m zoo.bench breakdown`: HLO and aten op classification, shares, the command."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from zoo.bench.cli import main
from zoo.bench.investigations import breakdown


def _compiled_text() -> str:
    def f(x, w, m):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        z = y.reshape(2, -1) @ m
        return jnp.tanh(z).T, y.sum()

    args = (jnp.ones((2, 4, 4, 3)), jnp.ones((3, 3, 3, 5)), jnp.ones((80, 6)))
    return jax.jit(f).lower(*args).compile().as_text()


def test_classify_finds_the_convolution_dot_and_reduction():
    categories = breakdown.classify(_compiled_text())
    found = set(categories.values())
    assert {"convolution", "matmul", "reduction"} <= found, categories
    # Parameters and the entry's tuple do no work: never classified.
    assert not any(name.startswith(("param", "tuple")) for name in categories)


def test_classify_looks_inside_fusions():
    hlo = """HloModule m

%fused (p: f32[4,4]) -> f32[4,4] {
  %p = f32[4,4]{1,0} parameter(0)
  ROOT %dot.1 = f32[4,4]{1,0} dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  %ynn_fusion = f32[4,4]{1,0} fusion(%a), kind=kCustom, calls=%fused
  ROOT %t = f32[4,4]{0,1} transpose(%ynn_fusion), dimensions={1,0}
}
"""
    categories = breakdown.classify(hlo)
    assert categories["ynn_fusion"] == "matmul"
    assert categories["t"] == "transpose/copy + elementwise"
    assert "a" not in categories


def test_torch_categories_and_shares():
    assert breakdown.torch_category("aten::convolution_backward") == "convolution"
    assert breakdown.torch_category("aten::addmm") == "matmul"
    assert breakdown.torch_category("aten::native_layer_norm") == "normalization"
    assert breakdown.torch_category("aten::gelu") == "elementwise"
    got = breakdown.shares({"a": 3.0, "b": 1.0, "untraced": 5.0},
                           {"a": "convolution", "b": "matmul"})
    assert got == pytest.approx({"convolution": 0.75, "matmul": 0.25})
    assert list(got) == ["convolution", "matmul"]  # largest first


def test_breakdown_command(capsys):
    assert main(["breakdown", "mlp", "--preset", "tiny", "--impl", "nnx", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "mlp train, batch" in out and "matmul" in out
    shares = [float(line.split()[-1].rstrip("%")) for line in out.splitlines()
              if line.endswith("%")]
    assert sum(shares) == pytest.approx(100.0, abs=0.5)  # tolerance: shares printed rounded
    assert max(len(line) for line in out.splitlines()) <= 80


def test_breakdown_of_a_decode_step(capsys):
    """`--mode decode`: `zoo.generate`'s step, its state carried from call to call (it donates
    it), in the JAX libraries by default."""
    assert main(["breakdown", "gpt2", "--preset", "tiny", "--mode", "decode", "--steps",
                 "2"]) == 0
    out = capsys.readouterr().out
    assert "gpt2 decode, batch 1" in out and "matmul" in out
    heads = [line.split(":")[0].strip() for line in out.splitlines()[1:]
             if not line.endswith("%")]
    assert heads == ["eqx", "linen", "nnx"] and "ms a step in these ops" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["mlp", "--impl", "jax"], "unknown --impl ['jax']"),
    (["vit", "--mode", "decode"], "--mode decode: vit does not generate text"),
    (["gpt2", "--preset", "tiny", "--mode", "decode", "--impl", "nnx,torch"],
     "--mode decode profiles the JAX libraries' step"),
    (["mlp", "--preset", "nope"], "no preset 'nope'"),
    (["mlp", "--steps", "0"], "--steps: expected an int >= 1, got '0'"),
    (["mlp", "--torch-threads", "0"], "--torch-threads: expected an int >= 1, got '0'"),
    (["mlp", "--batch", "-1"], "--batch: expected an int >= 1, got '-1'"),
    (["nope"], "unknown benchmark subject 'nope'"),
])
def test_breakdown_bad_input(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(["breakdown", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1
