"""The mixtures of experts (`zoo.layers.moe`, the decoder body's `moe` MLP kind, the `mixtral`
family): the dispatch (tokens sorted by expert, grouped matmuls) equals the dense reference
(every expert on every token) in values and gradients; the load-balancing loss of the router
logits a model returns with `output_router_logits` equals transformers' `aux_loss`, and a
`zoo.runtime.fast` training step with `zoo.runtime.training.router_loss` has transformers' `labels=`
loss (cross-entropy plus `router_aux_loss_coef * aux_loss`) and its gradients in every JAX library;
transformers' per-expert files stack into the fused experts and back."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import converters
import zoo
from converters.adapters import HF_MIXTRAL, HF_QWEN3_MOE, AdapterError
from tests.lm_reference import VARIANTS, hf_model_of, padded_batch
from zoo.layers.moe import dense_experts, load_balancing_loss, route, sorted_experts
from zoo.runtime import fast
from zoo.runtime.training import IGNORE, next_token, router_loss
from zoo.testing import assert_close

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_the_dispatch_equals_the_dense_reference_values_and_gradients():
    top_k, normalize = 2, False
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (13, 8))
    gate_up = jax.random.normal(keys[1], (4, 8, 12)) / 3
    down = jax.random.normal(keys[2], (4, 6, 8)) / 3
    router = jax.random.normal(keys[3], (8, 4))

    def run(fn, x, gate_up, down, router):
        weights, experts = route(x @ router, top_k, normalize)
        return fn(x, weights, experts, gate_up, down, jax.nn.silu)

    args = (x, gate_up, down, router)
    assert_close(jax.jit(run, static_argnums=0)(sorted_experts, *args),
                 jax.jit(run, static_argnums=0)(dense_experts, *args))
    grad = lambda fn: jax.jit(jax.grad(lambda *a: jnp.sum(run(fn, *a) ** 2),
                                       argnums=(0, 1, 2, 3)))(*args)
    assert_close(grad(sorted_experts), grad(dense_experts))


def test_a_model_computes_the_same_logits_with_either_dispatch():
    cfg, impl = VARIANTS["qwen3-moe-dense-layer"], "nnx"
    ids = np.asarray(cfg.sample_input(jax.random.key(1), 2))
    state = converters.to_canonical(zoo.create(cfg, impl, seed=0), impl)
    logits = {d: zoo.interface(impl).forward(converters.from_canonical(
        state, dataclasses.replace(cfg, dispatch=d), impl), ids) for d in ("sorted", "dense")}
    assert_close(logits["sorted"], logits["dense"])


def _torch_loss(logits, router, labels: np.ndarray, mask: np.ndarray, cfg) -> torch.Tensor:
    """transformers' `labels=` loss with `output_router_logits`, written in PyTorch on the
    reference's outputs: the next-token cross-entropy plus the coefficient times
    `load_balancing_loss_func` over the unpadded tokens (what the JAX libraries' gradients are
    checked against: on this left-padded batch transformers' own gradients differ from the
    reference's in the attention's q/k projections, for the dense Llama family as well)."""
    import torch.nn.functional as F

    target = torch.from_numpy(labels[:, 1:]).long()
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), target.flatten(), ignore_index=IGNORE)
    probs = torch.softmax(router.float(), dim=-1)
    counts = F.one_hot(torch.topk(probs, cfg.num_experts_per_tok)[1], probs.shape[-1]).sum(-2)
    m = torch.from_numpy(mask).float()[:, None, :, None]
    rows = m.sum() * router.shape[1]
    aux = probs.shape[-1] * torch.sum((counts * m).sum((0, 1, 2)) / rows
                                      * (probs * m).sum((0, 1, 2)) / rows)
    return ce + cfg.router_aux_loss_coef * aux


@pytest.mark.full_only
def test_the_load_balancing_loss_and_its_gradients_equal_transformers():
    """On Qwen3-MoE's variant (a dense layer between sparse ones, top-k weights not
    renormalised); Mixtral's training step without the loss is in
    tests/test_language_models.py."""
    cfg = dataclasses.replace(VARIANTS["qwen3-moe-dense-layer"], output_router_logits=True,
                              router_aux_loss_coef=0.5)  # large enough to bite
    hf = hf_model_of(cfg)
    state = {k: v.numpy().copy() for k, v in hf.state_dict().items()}
    ids, mask, pos = padded_batch(cfg, seed=1)
    labels = np.where(mask.astype(bool), ids, IGNORE).astype(np.int32)
    with torch.no_grad():
        out = hf(**{k: torch.from_numpy(a).long() for k, a in zip(
            ("input_ids", "attention_mask", "position_ids", "labels"), (ids, mask, pos, labels),
            strict=True)}, output_router_logits=True)

    reference = converters.from_canonical(state, cfg, "torch")
    logits, router = reference(*(torch.from_numpy(a) for a in (ids, mask, pos)))
    assert router.shape == (len(ids), len(cfg.sparse_layers), cfg.length, 4)
    aux = load_balancing_loss(jnp.asarray(router.detach().numpy()), cfg.num_experts_per_tok,
                              mask)
    assert_close(float(aux), out.aux_loss.item())
    loss_t = _torch_loss(logits, router, labels, mask, cfg)
    assert_close(loss_t.item(), out.loss.item())
    loss_t.backward()
    want = {k: p.grad.numpy() for k, p in reference.named_parameters()}
    assert all(np.abs(want[k]).max() > 0 for k in want if "mlp.gate" in k)

    loss_fn = router_loss(next_token, cfg.router_aux_loss_coef, cfg.num_experts_per_tok)
    for impl in zoo.JAX_IMPLS:
        model = converters.from_canonical(state, cfg, impl)
        before = converters.to_canonical(model, impl)
        step = fast.train_step(model, impl, optax.sgd(1.0), loss_fn)
        loss = step(ids, labels, attention_mask=mask, position_ids=pos)
        assert_close(float(loss), out.loss.item(), err_msg=impl)
        after = converters.to_canonical(step.model(), impl)
        assert_close({k: np.asarray(before[k]) - np.asarray(after[k]) for k in after},
                     {k: want[k] for k in after}, err_msg=impl)


def test_per_expert_files_stack_into_the_fused_experts_and_back():
    gate = [np.full((3, 2), j, np.float32) for j in range(2)]
    up = [np.full((3, 2), 10 + j, np.float32) for j in range(2)]
    down = [np.full((2, 3), 20 + j, np.float32) for j in range(2)]
    layer = "model.layers.0.block_sparse_moe."
    foreign = {f"{layer}experts.{j}.{w}.weight": a[j] for j in range(2)
               for w, a in (("w1", gate), ("w3", up), ("w2", down))}
    foreign[layer + "gate.weight"] = np.ones((2, 2), np.float32)
    zoo_state = HF_MIXTRAL.to_zoo(foreign)
    fused = zoo_state["model.layers.0.mlp.experts.gate_up_proj"]
    assert fused.shape == (2, 6, 2) and fused[1, :3].max() == 1 and fused[1, 3:].min() == 11
    assert zoo_state["model.layers.0.mlp.experts.down_proj"].shape == (2, 2, 3)
    assert "model.layers.0.mlp.gate.weight" in zoo_state
    back = HF_MIXTRAL.from_zoo(zoo_state)
    assert back.keys() == foreign.keys()
    assert all(np.array_equal(back[k], foreign[k]) for k in foreign)
    del foreign[layer + "experts.1.w3.weight"]
    with pytest.raises(AdapterError, match=r"the experts' w1 and w3 of 'model.layers.0.mlp."
                                           r"experts.gate_up_proj' are stored apart and 1 "
                                           r"are missing \(index, part\): \[\(1, 1\)\]"):
        HF_MIXTRAL.to_zoo(foreign)
    assert HF_QWEN3_MOE.coverage(back) < 0.5 < HF_MIXTRAL.coverage(back)  # chosen by content
