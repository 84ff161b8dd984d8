"""LoRA in every library (matched with `peft` on transformers' models), adapters through PEFT's
files both ways, and trainable / frozen partitions in `zoo.runtime.fast`."""

from __future__ import annotations

import copy
import functools

import jax
import numpy as np
import optax
import pytest

import canonical
import converters
import zoo
import zoo.lora
from tests.lm_reference import hf_model_of
from zoo.lora import common
from zoo.partition import Partition
from zoo.registry import walk_facts
from zoo.runtime import fast
from zoo.runtime.training import next_token
from zoo.testing import assert_close

# peft 0.21's PeftModel asks transformers 5 for `is_gradient_checkpointing`, which warns that
# it is deprecated: their exchange, not the zoo's; the run stays quiet.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
JAX_IMPLS = ("eqx", "linen", "nnx")


@functools.cache
def tokens(config: zoo.Config, batch: int = 2) -> np.ndarray:
    rng = np.random.default_rng(1)
    return rng.integers(0, config.vocab_size, (batch, config.seq_len)).astype(np.int32)


def unchanged(before, after, impl) -> list[bool]:
    """Per parameter (leaf order), whether `after`'s array is bitwise `before`'s."""
    api = zoo.interface(impl)
    old, new = (jax.tree.leaves(api.split(m)[1]) for m in (before, after))
    return [bool(np.array_equal(a, b)) for a, b in zip(old, new, strict=True)]


# Every library's partition is also run by the LoRA training test below.
@pytest.mark.parametrize("impl", ["nnx", *(pytest.param(i, marks=pytest.mark.exhaustive)
                                          for i in ("eqx", "linen"))])
def test_a_partition_trains_its_part_and_leaves_the_rest_bitwise(impl):
    config = zoo.tiny_config("gpt2")
    model = zoo.create(config, impl, seed=0)
    api = zoo.interface(impl)
    names = api.leaf_names(*api.split(model)[:2])
    trainable = Partition.freezing_blocks(1)
    step = fast.train_step(model, impl, optax.adam(1e-2), next_token, trainable=trainable,
                           steps_per_call=2)
    x = np.stack([tokens(config)] * 2)
    step(x, x)
    same = unchanged(model, step.model(), impl)
    assert same == [not trainable(n) for n in names]
    assert any(same) and not all(same)


def test_partition_names_are_one_form_in_every_library():
    config = zoo.tiny_config("gpt2")
    named = {}
    for impl in JAX_IMPLS:
        api = zoo.interface(impl)
        named[impl] = {n.rsplit(".", 1)[0] for n in api.leaf_names(
            *api.split(zoo.create(config, impl, seed=0))[:2])}
    assert named["eqx"] == named["linen"] == named["nnx"]
    assert "transformer.h.1.attn.c_attn" in named["linen"]


def test_a_partition_that_trains_nothing_is_refused_in_one_line():
    model = zoo.create(zoo.tiny_config("gpt2"), "nnx", seed=0)
    with pytest.raises(ValueError, match="trains none of the") as e:
        fast.train_step(model, "nnx", optax.sgd(0.1), next_token,
                        trainable=Partition.only("no_such.*"))
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="non-empty name patterns"):
        Partition.only()


# --------------------------------------------------------------------------- LoRA
ARCHS = {"gpt2": ("c_attn",), "llama": ("q_proj", "v_proj")}
ALL_IMPLS = ("eqx", "linen", "nnx", "torch")


def with_random_b(model, impl, targets, seed=3):
    """`model` with LoRA on `targets`, B drawn at random (peft's zeros would hide A)."""
    plain = zoo.lora.add(model, impl, rank=4, alpha=8, targets=targets)
    given = zoo.lora.adapter(plain, impl)
    rng = np.random.default_rng(seed)
    given.factors = {k: (a, rng.normal(size=b.shape).astype(np.float32))
                     for k, (a, b) in given.factors.items()}
    return zoo.lora.attach(model, impl, given), given


def logits(model, impl, x):
    if impl == "torch":
        return zoo.native_interface(impl).forward(model, x)
    return np.asarray(fast.forward(model, impl)(x))


# Llama's LoRA is matched with peft below; its merge here with --exhaustive.
@pytest.mark.parametrize("arch", ["gpt2", pytest.param("llama", marks=pytest.mark.exhaustive)])
def test_same_seed_same_adapter_and_merged_weights_are_base_plus_scaled_ba(arch):
    config = zoo.tiny_config(arch)
    firsts, merged_out = [], {}
    for impl in ALL_IMPLS:
        model = zoo.create(config, impl, seed=0)
        lora, given = with_random_b(model, impl, ARCHS[arch])
        firsts.append(zoo.lora.adapter(zoo.lora.add(model, impl, targets=ARCHS[arch]), impl))
        merged = zoo.lora.merge(lora, impl)
        base, after = (canonical.read(m, impl, **walk_facts(config, impl))
                       for m in (model, merged))
        for name, (a, b) in given.factors.items():
            delta = given.spec.scale * (b @ a)
            fan = name.endswith("c_attn")  # GPT-2's Conv1D: (in, out)
            want = base[f"{name}.weight"] + (delta.T if fan else delta)
            assert_close(after[f"{name}.weight"], want)
        merged_out[impl] = logits(merged, impl, tokens(config))
        assert_close(logits(lora, impl, tokens(config)), merged_out[impl])
        back = zoo.lora.unmerge(merged, impl, given)
        for k, v in canonical.read(back, impl, **walk_facts(config, impl)).items():
            assert_close(v, base[k])
    for other in firsts[1:]:  # the same seed: the same factors, bit for bit
        for k, (a, b) in firsts[0].factors.items():
            assert np.array_equal(a, other.factors[k][0]) and not b.any()
    for impl in ALL_IMPLS:
        assert_close(merged_out[impl], merged_out["torch"])


def test_a_bad_target_rank_or_alpha_is_refused_in_one_line():
    model = zoo.create(zoo.tiny_config("gpt2"), "eqx", seed=0)
    for kwargs, words in (({"targets": ("q_proj",)}, "named 'q_proj'"),
                          ({"targets": ("c_attn",), "rank": 0}, "rank must be"),
                          ({"targets": ("c_attn",), "alpha": -1}, "alpha must be"),
                          ({"targets": ("c_attn",), "dropout": 0.1}, "dropout=0.1")):
        with pytest.raises(ValueError, match=words) as e:
            zoo.lora.add(model, "eqx", **kwargs)
        assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- peft
REFERENCE_ATOL = 1e-5  # tolerance: the bound on logits against peft's (float32)


@pytest.fixture(scope="module")
def peft_reference(tmp_path_factory):
    """`get(arch)`: `peft_case` of `arch`, built once per module."""
    cases = {}

    def get(arch: str):
        if arch not in cases:
            cases[arch] = peft_case(arch, tmp_path_factory.mktemp(f"peft-{arch}"))
        return cases[arch]

    return get


def peft_case(arch: str, folder):
    """transformers' reference model, its canonical state and a peft LoRA model on it (B drawn
    at random) saved by peft to `folder`; peft's logits and LoRA gradients (next-token loss)
    on the test tokens, canonical names."""
    import peft
    import torch

    config = zoo.tiny_config(arch)
    hf = hf_model_of(config)
    state = {k: v.numpy().copy() for k, v in hf.state_dict().items()}
    model = peft.get_peft_model(copy.deepcopy(hf), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=list(ARCHS[arch]), fan_in_fan_out=arch == "gpt2"))
    torch.manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    model.save_pretrained(folder)
    ids = torch.from_numpy(tokens(config)).long()
    out = model(ids, labels=ids)
    out.loss.backward()
    grads = {n.removeprefix("base_model.model.").replace(".default", ""): p.grad.numpy()
             for n, p in model.named_parameters() if p.grad is not None}
    return config, hf, state, folder, out.logits.detach().numpy(), grads


def lora_grads(model, impl, x) -> dict[str, np.ndarray]:
    """The next-token loss's gradients of the LoRA factors, canonical names and layout."""
    if impl == "torch":
        import torch

        model = copy.deepcopy(model)
        ids = torch.from_numpy(x).long()
        torch.nn.functional.cross_entropy(model(ids)[:, :-1].flatten(0, 1),
                                          ids[:, 1:].flatten()).backward()
        return {f"{n}.lora_{w}.weight": getattr(m, f"lora_{w}").weight.grad.numpy()
                for n, m in model.named_modules() if hasattr(m, "lora_A") for w in "AB"}
    api = zoo.interface(impl)
    static, params, state = api.split(model)
    train, frozen = api.partition(static, params, zoo.lora.TRAINABLE)

    def loss(train):
        return next_token(api.apply(static, api.combine(train, frozen), state, x)[0], x)

    grads = jax.jit(jax.grad(loss))(train)
    factors = common.factors(api.merge(static, api.combine(grads, frozen), state), impl)
    return {f"{n}.lora_{w}.weight": f[i] for n, f in factors.items()
            for i, w in enumerate("AB")}


@pytest.mark.parametrize("arch", ["gpt2", pytest.param("llama", marks=pytest.mark.full_only)])
@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_a_peft_adapter_loads_in_every_library_and_goes_back_to_peft_strictly(
        arch, impl, peft_reference, tmp_path_factory):
    peft = pytest.importorskip("peft")
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    config, hf, state, folder, want, want_grads = peft_reference(arch)
    model = zoo.lora.load(converters.from_canonical(state, config, impl), impl, folder)
    x = tokens(config)
    np.testing.assert_allclose(logits(model, impl, x), want, atol=REFERENCE_ATOL)
    got = lora_grads(model, impl, x)
    assert got.keys() == want_grads.keys()
    assert_close(got, {k: want_grads[k] for k in got})

    out = tmp_path_factory.mktemp(f"zoo-{arch}-{impl}")
    zoo.lora.save(model, impl, out)
    back = peft.PeftModel.from_pretrained(copy.deepcopy(hf), out)
    loaded = set_peft_model_state_dict(back, load_file(out / "adapter_model.safetensors"))
    assert not loaded.unexpected_keys
    assert not [k for k in loaded.missing_keys if "lora_" in k]
    import torch

    with torch.no_grad():
        again = back(torch.from_numpy(x).long()).logits.numpy()
    np.testing.assert_allclose(again, want, atol=REFERENCE_ATOL)


# --------------------------------------------------------------------------- training
@pytest.mark.parametrize("impl", JAX_IMPLS)
def test_a_lora_model_trains_its_factors_alone_with_the_fast_step(impl):
    config = zoo.tiny_config("gpt2")
    model = zoo.lora.add(zoo.create(config, impl, seed=0), impl, rank=2, targets=("c_attn",))
    api = zoo.interface(impl)
    names = api.leaf_names(*api.split(model)[:2])
    step = fast.train_step(model, impl, optax.adam(1e-2), next_token,
                           trainable=zoo.lora.TRAINABLE)
    x = tokens(config)
    losses = [float(step(x, x)) for _ in range(3)]
    assert losses[-1] < losses[0]
    trained = step.model()
    assert unchanged(model, trained, impl) == ["lora_" not in n for n in names]
    assert len(jax.tree.leaves(step.opt_state)) == 1 + 2 * 4  # count; mu, nu of 4 factors
    assert zoo.lora.adapter(trained, impl).factors.keys() == {
        "transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"}


def test_a_merged_lora_model_goes_to_a_hub_folder_transformers_reads(tmp_path):
    import torch
    import transformers

    config = zoo.tiny_config("gpt2")
    lora, _ = with_random_b(zoo.create(config, "nnx", seed=0), "nnx", ("c_attn",))
    converters.save(zoo.lora.merge(lora, "nnx"), tmp_path / "hub", "hub", impl="nnx")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hub").eval()
    x = tokens(config)
    with torch.no_grad():
        got = hf(torch.from_numpy(x).long()).logits.numpy()
    np.testing.assert_allclose(got, logits(lora, "nnx", x), atol=REFERENCE_ATOL)
