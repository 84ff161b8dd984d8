"""What a `zoo.generate` call asks for, checked once at the boundary (one-line errors naming
the argument), and the prompt it is given as NumPy arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Settings:
    """`max_new_tokens` to add after the prompt; greedy when `temperature` is 0, else sampled
    at that temperature, among the `top_k` likeliest tokens (0: all) and the smallest set whose
    probability reaches `top_p` (1: all), in `transformers`' order, from `seed`. A sequence
    stops at any of `eos_token_ids` (none: at `max_new_tokens`), padded with `pad_token_id`
    after it. `max_length`: the cache's length (default: prompt plus new tokens)."""

    max_new_tokens: int = 20
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    max_length: int | None = None

    @classmethod
    def of(cls, *, max_new_tokens: int = 20, temperature: float | None = 0.0,
           top_k: int | None = 0, top_p: float | None = 1.0, seed: int = 0,
           eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
           max_length: int | None = None) -> Settings:
        """Checked settings from `zoo.generate`'s arguments (`pad_token_id` defaults to the
        first EOS token, as `transformers` does)."""
        if not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        temperature = 0.0 if temperature is None else float(temperature)
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
        top_k = top_k or 0
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no limit), got {top_k}")
        top_p = 1.0 if top_p is None else float(top_p)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        eos = (() if eos_token_id is None else (int(eos_token_id),)
               if isinstance(eos_token_id, int | np.integer)
               else tuple(int(e) for e in eos_token_id))
        pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
        return cls(int(max_new_tokens), temperature, int(top_k), top_p, int(seed), eos,
                   int(pad), max_length)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def cache_length(self, prompt: int, model_limit: int | None) -> int:
        """The cache's length for a prompt of `prompt` tokens, checked against the prompt,
        the new tokens and the positions the model has (`model_limit`, None: any)."""
        length = self.max_length if self.max_length is not None else prompt + self.max_new_tokens
        if prompt > length:
            raise ValueError(f"input_ids: the prompt's {prompt} tokens do not fit max_length "
                             f"{length} (the cache's length)")
        if prompt + self.max_new_tokens > length:
            raise ValueError(f"max_new_tokens {self.max_new_tokens} after a prompt of {prompt} "
                             f"tokens exceeds max_length {length} (the cache's length)")
        if model_limit is not None and length > model_limit:
            raise ValueError(f"max_new_tokens {self.max_new_tokens}: the {length} tokens of "
                             f"prompt and new tokens exceed the model's {model_limit} positions")
        return length


def prompt(input_ids: Any, attention_mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) `(N, L)` int32 NumPy arrays of a prompt batch (any array type; no mask:
    every token counts), checked."""
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"input_ids must be integer token ids (batch, length), got shape "
                         f"{ids.shape} {ids.dtype}")
    if ids.shape[1] == 0:
        raise ValueError("input_ids: the prompt is empty (length 0)")
    mask = np.ones(ids.shape, np.int32) if attention_mask is None else np.asarray(attention_mask)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask of shape {mask.shape} does not match input_ids "
                         f"{ids.shape}")
    return ids.astype(np.int32), mask.astype(np.int32)
