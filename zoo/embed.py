"""Sentence embeddings of an encoder (BERT, RoBERTa): the last hidden states pooled over each
sequence's tokens, as sentence-transformers pools them.

    vectors = zoo.embed(model, "nnx", ["a sentence", "another"], tokenizer="hf-hub:ORG/REPO")
    vectors = zoo.embed(model, "nnx", token_ids, attention_mask)  # (N, hidden_size)

The inputs are texts, tokenized by the model's own `tokenizer.json` (`tokenizer`: a folder,
``local-dir:PATH``, ``hf-hub:ORG/REPO`` from the Hugging Face cache, or a `zoo.tokenizer`
`Tokenizer`), or token ids `(N, L)` padded with `attention_mask` (1 for a token, 0 for
padding). `pooling` "mean" averages the tokens' states (the padding left out), "cls" takes
the first token's; by default the named model's (`pooling` in its config: "mean" for
all-MiniLM-L6-v2).

In the JAX libraries the encoder and the pooling run as one compiled program per shape
bucket: the batch is padded to the next power of two of sequences and of tokens (at least
`MIN_TOKENS`, at most the model's positions), the padding left out of the result, and the
program is kept (`jax.jit`'s cache, keyed by the library, the model's structure, the pooling
and the bucket); `compilations()` counts the programs traced. PyTorch runs eagerly.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from zoo.libraries import library, native_interface

POOLINGS = ("mean", "cls")
MIN_TOKENS = 8  # the smallest token bucket
_TRACED = [0]  # programs traced by `_pooled` (one per bucket, library, model structure)


def compilations() -> int:
    """How many encode-and-pool programs `embed` has traced so far in this process."""
    return _TRACED[0]


def _config(model: Any) -> Any:
    return (model[0] if isinstance(model, tuple) else model).config


def _bucket(n: int, least: int, most: int | None) -> int:
    """The next power of two of `n` (at least `least`, at most `most` when `n` fits it)."""
    size = max(least, 1 << max(n - 1, 0).bit_length())
    return size if most is None or n > most else min(size, most)


def pool(h: Any, mask: Any, pooling: str) -> Any:
    """`pooling` of the hidden states `h` `(N, L, E)` under `mask` `(N, L)`."""
    h = jnp.asarray(h, jnp.float32)
    if pooling == "cls":
        return h[:, 0]
    weights = jnp.asarray(mask, h.dtype)[..., None]
    return (h * weights).sum(1) / jnp.maximum(weights.sum(1), 1e-9)


@functools.partial(jax.jit, static_argnames=("impl", "static", "pooling"))
def _pooled(arrays: Any, ids: Any, inputs: dict[str, Any], *, impl: str, static: Any,
            pooling: str) -> Any:
    _TRACED[0] += 1  # runs while tracing only: once per compiled program
    api = native_interface(impl)
    h = api.call(api.merge(static, *arrays), "encode", ids, inputs=inputs)
    return pool(h, inputs["attention_mask"], pooling)


def _compiled(model: Any, impl: str, ids: np.ndarray, inputs: dict[str, Any],
              pooling: str) -> Any:
    """The pooled states of `ids` through the bucket's compiled program."""
    config = _config(model)
    n, length = ids.shape
    rows = _bucket(n, 1, None)
    cols = _bucket(length, MIN_TOKENS, getattr(config, "max_length", None))
    pad = getattr(config, "pad_token_id", 0)

    def padded(a: np.ndarray, value: int) -> np.ndarray:
        return np.pad(a, ((0, rows - n), (0, cols - length)), constant_values=value)

    big = {k: padded(v, 0) for k, v in inputs.items() if v is not None}
    big["attention_mask"][n:, 0] = 1  # a padding row attends to one token: no empty softmax
    static, params, state = native_interface(impl).split(model)
    out = _pooled((params, state), padded(ids, pad), big, impl=impl, static=static,
                  pooling=pooling)
    return out[:n]


def embed(model: Any, impl: str, inputs: Any, attention_mask: Any = None, *,
          tokenizer: Any = None, token_type_ids: Any = None, pooling: str | None = None,
          max_length: int | None = None) -> Any:
    """Sentence embeddings `(N, hidden_size)` of texts (with `tokenizer`) or token ids
    `(N, L)` (see the module's docstring); `max_length` truncates texts (default: the
    tokenizer's, else the model's positions). A NumPy array for PyTorch, a JAX array
    otherwise."""
    config = _config(model)
    pooling = pooling or getattr(config, "pooling", None)
    if pooling not in POOLINGS:
        raise ValueError(f"pooling {pooling!r}: give one of {POOLINGS} (the model's config "
                         "declares none)" if pooling is None else
                         f"unknown pooling {pooling!r}; known: {POOLINGS}")
    if not hasattr(model[0] if isinstance(model, tuple) else model, "encode"):
        raise ValueError(f"a {config.arch} model has no encoder states to pool (encode)")
    if _texts(inputs):
        ids, attention_mask = _tokenized(inputs, tokenizer, config, max_length)
    else:
        ids = np.asarray(inputs, np.int32)
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, np.int32)
    types = None if token_type_ids is None else np.asarray(token_type_ids, np.int32)
    given = {"attention_mask": mask, "token_type_ids": types}
    if library(impl).is_jax:
        return _compiled(model, impl, ids, given, pooling)
    states = native_interface(impl).call(model, "encode", ids, inputs=given)
    return np.asarray(pool(states, mask, pooling))  # PyTorch's: NumPy


def _texts(inputs: Any) -> bool:
    return isinstance(inputs, str) or (isinstance(inputs, Sequence) and bool(inputs)
                                       and all(isinstance(t, str) for t in inputs))


def _tokenized(texts: Any, tokenizer: Any, config: Any, max_length: int | None
               ) -> tuple[np.ndarray, np.ndarray]:
    from zoo.tokenizer import Tokenizer, load

    if tokenizer is None:
        raise ValueError("texts need the model's tokenizer: tokenizer= a folder, "
                         "local-dir:PATH or hf-hub:ORG/REPO holding tokenizer.json, or "
                         "zoo.tokenizer.load's")
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else load(
        os.fspath(tokenizer) if isinstance(tokenizer, os.PathLike) else tokenizer)
    limit = max_length or tok.model_max_length or getattr(config, "max_length", None)
    return tok(texts, max_length=limit)
