"""Sentence embeddings of an encoder (BERT, RoBERTa): the last hidden states pooled over each
sequence's tokens, as sentence-transformers pools them.

    vectors = zoo.embed(model, "nnx", token_ids, attention_mask)  # (N, hidden_size)

The inputs are token ids `(N, L)` (a tokenizer's, e.g. `tokenizers`' WordPiece for BERT),
padded with `attention_mask` (1 for a token, 0 for padding); the zoo has no tokenizer of its
own. `pooling` "mean" averages the tokens' states (the padding left out), "cls" takes the
first token's; by default the named model's (`pooling` in its config: "mean" for
all-MiniLM-L6-v2).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from zoo.libraries import native_interface

POOLINGS = ("mean", "cls")


def _config(model: Any) -> Any:
    return (model[0] if isinstance(model, tuple) else model).config


def embed(model: Any, impl: str, input_ids: Any, attention_mask: Any = None, *,
          token_type_ids: Any = None, pooling: str | None = None) -> Any:
    """Sentence embeddings `(N, hidden_size)` of token ids `(N, L)` (see the module's
    docstring); a NumPy array for PyTorch, a JAX array otherwise."""
    config = _config(model)
    pooling = pooling or getattr(config, "pooling", None)
    if pooling not in POOLINGS:
        raise ValueError(f"pooling {pooling!r}: give one of {POOLINGS} (the model's config "
                         "declares none)" if pooling is None else
                         f"unknown pooling {pooling!r}; known: {POOLINGS}")
    if not hasattr(model[0] if isinstance(model, tuple) else model, "encode"):
        raise ValueError(f"a {config.arch} model has no encoder states to pool (encode)")
    ids = np.asarray(input_ids, np.int32)
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, np.int32)
    types = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids,
                                                                         np.int32)
    states = native_interface(impl).call(model, "encode", ids,
                                         inputs={"attention_mask": mask,
                                                 "token_type_ids": types})
    h = jnp.asarray(states, jnp.float32)
    if pooling == "cls":
        out = h[:, 0]
    else:
        weights = jnp.asarray(mask, h.dtype)[..., None]
        out = (h * weights).sum(1) / jnp.maximum(weights.sum(1), 1e-9)
    return np.asarray(out) if isinstance(states, np.ndarray) else out  # PyTorch's: NumPy
