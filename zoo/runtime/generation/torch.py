"""The PyTorch reference's decode loop, eager, with its own `KVCache`: the same slots,
positions, stopping and padding as the JAX loop (`zoo.runtime.generation.loop`); sampling draws from
`torch.Generator` seeded with `seed` (the same filters, not the same draws as JAX)."""

from __future__ import annotations

import numpy as np
import torch

from zoo.layers.causal import positions
from zoo.runtime.generation.settings import Settings


def _filtered(logits: torch.Tensor, s: Settings) -> torch.Tensor:
    logits = logits.float() / s.temperature
    if s.top_k:
        kth = torch.topk(logits, min(s.top_k, logits.shape[-1]))[0][..., -1:]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if s.top_p < 1.0:
        ascending = logits.sort(dim=-1).values
        mass = ascending.softmax(dim=-1).cumsum(dim=-1)
        dropped = (mass <= 1 - s.top_p).sum(dim=-1, keepdim=True)
        cutoff = ascending.gather(-1, dropped.clamp(max=logits.shape[-1] - 1))
        logits = logits.masked_fill(logits < cutoff, -torch.inf)
    return logits


@torch.no_grad()
def generate(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray, settings: Settings,
             max_length: int) -> torch.Tensor:
    """The sequences `(N, L + generated)` `model` (in eval mode) generates after the prompt
    `ids`, `mask` `(N, L)`, in a cache of `max_length` slots."""
    s, (n, length) = settings, ids.shape
    was_training = model.training
    model.eval()
    try:
        tokens = torch.from_numpy(ids).long()
        device = next(model.parameters()).device
        tokens, prompt_mask = tokens.to(device), torch.from_numpy(mask).long().to(device)
        if s.max_new_tokens == 0:
            return tokens
        slots = torch.zeros(n, max_length, dtype=torch.long, device=device)
        slots[:, :length] = prompt_mask
        pos = positions(prompt_mask)
        cache = model.init_cache(n, max_length)
        generator = torch.Generator(device=device).manual_seed(s.seed)
        eos = torch.tensor(s.eos_token_ids, dtype=torch.long, device=device)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        logits = model(tokens, slots, pos, cache=cache)[:, -1]
        out = [tokens]
        for step in range(s.max_new_tokens):
            if s.greedy:
                token = logits.argmax(dim=-1)
            else:
                probs = _filtered(logits, s).softmax(dim=-1)
                token = torch.multinomial(probs, 1, generator=generator)[:, 0]
            token = torch.where(done, torch.full_like(token, s.pad_token_id), token)
            out.append(token[:, None])
            done = done | torch.isin(token, eos)
            if bool(done.all()) or step == s.max_new_tokens - 1:
                break
            slots[:, length + step] = 1
            pos = pos[:, -1:] + 1
            logits = model(token[:, None], slots, pos, cache=cache)[:, -1]
        return torch.cat(out, dim=1)
    finally:
        model.train(was_training)
