"""Generation for the zoo's language models: `generate`, the same entry point in every library.

    model = zoo.create("gpt2", "nnx", seed=0)
    sequences = zoo.generate(model, "nnx", input_ids, max_new_tokens=32)

Each library keeps its KV cache in its own idiom (Equinox an explicit `KVCache` threaded
through the call, Linen `decode=True` and its "cache" collection, NNX `nnx.Cache` variables
from `init_cache`, PyTorch's reference its own `KVCache`), preallocated to the cache's length
and written at its index: one program for every step. Its interface (`zoo.interface`) gives the
decoding step; the JAX libraries share one decode loop (`zoo.runtime.generation.loop`), compiled
whole by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zoo.runtime.generation.settings import Settings, prompt

__all__ = ["Settings", "generate"]


def generate(model: Any, impl: str, input_ids: Any, attention_mask: Any = None, *,
             max_new_tokens: int = 20, temperature: float | None = 0.0,
             top_k: int | None = 0, top_p: float | None = 1.0, seed: int = 0,
             eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
             max_length: int | None = None, style: str | None = None) -> Any:
    """The sequences `model` (a native model of library `impl`) generates after the prompts
    `input_ids` `(N, L)`: `(N, L + new)` token ids, prompt included, as `transformers`'
    `generate` returns them (a JAX array, a tensor for PyTorch).

    Left-pad a batch of prompts of different lengths and give `attention_mask` (1 for a
    token, 0 for padding). Greedy unless `temperature` > 0, then sampled from `seed` after
    `top_k` and `top_p` (`transformers`' processors, in its order). A sequence stops at
    `eos_token_id` (one or several ids), padded after it with `pad_token_id` (default: the
    EOS id); the result is as long as the longest. `max_length`: the KV cache's length
    (default: the prompt plus `max_new_tokens`). `style`: the JAX loop's call style
    ("compiled", the default: the whole loop in one program; "python": one jitted step per
    token; "flat": the same on the weights' flat leaves).
    """
    from zoo.libraries import native_interface

    native = model[0] if isinstance(model, tuple) else model  # Linen's: (module, variables)
    config = getattr(native, "config", None)
    if not getattr(config, "GENERATES", False):
        what = type(native).__name__ if config is None else f"{config.arch} model"
        why = ("an encoder: its config's GENERATES is false" if hasattr(config, "GENERATES")
               else "not one of the zoo's language models")
        raise ValueError(f"a {what} does not generate text ({why})")
    settings = Settings.of(max_new_tokens=max_new_tokens, temperature=temperature,
                           top_k=top_k, top_p=top_p, seed=seed, eos_token_id=eos_token_id,
                           pad_token_id=pad_token_id, max_length=max_length)
    ids, mask = prompt(input_ids, attention_mask)
    styled = {} if style is None else {"style": style}  # each interface has its default
    return native_interface(impl).generate(model, ids, mask, settings, **styled)
