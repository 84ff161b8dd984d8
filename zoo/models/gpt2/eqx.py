"""GPT-2 in Equinox: one sequence of token ids `(L,)` per call, batched with vmap; the tied
head is `h @ wte.weight.T` (no array of its own). Decoding threads an explicit `KVCache`
through the call (`init_cache`)."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.causal import attend, default_positions, sequence_mask, write_cache
from zoo.layers.eqx import Conv1D, KVCache, LayerNorm, Linear
from zoo.models.common import activation, dtype_of
from zoo.models.gpt2.config import GPT2Config

KV = tuple[Array, Array]  # one layer's cached keys and values


def _keys(key: PRNGKeyArray | None, n: int) -> list[PRNGKeyArray | None]:
    return [None] * n if key is None else list(jax.random.split(key, n))


def _layer_norm(config: GPT2Config, dtype) -> LayerNorm:
    return LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, dtype=dtype)


def _tokenwise(layer: eqx.Module, x: Array) -> Array:
    return jax.vmap(layer)(x)


class Attention(eqx.Module):
    c_attn: Conv1D
    c_proj: Conv1D
    attn_dropout: eqx.nn.Dropout
    resid_dropout: eqx.nn.Dropout
    num_heads: int = eqx.field(static=True)

    def __init__(self, config: GPT2Config, *, key: PRNGKeyArray, dtype=None) -> None:
        k1, k2 = jax.random.split(key)
        e = config.n_embd
        self.c_attn = Conv1D(e, 3 * e, key=k1, dtype=dtype)
        self.c_proj = Conv1D(e, e, key=k2, dtype=dtype)
        self.attn_dropout = eqx.nn.Dropout(config.attn_pdrop)
        self.resid_dropout = eqx.nn.Dropout(config.resid_pdrop)
        self.num_heads = config.n_head

    def __call__(self, x: Array, mask: Array, kv: KV | None = None, index: Array | int = 0,
                 *, key: PRNGKeyArray | None = None) -> tuple[Array, KV | None]:
        """The attention's output and, given the cached `kv`, the cache with this call's keys
        and values written at `index`."""
        k1, k2 = _keys(key, 2)
        length = x.shape[0]
        q, k, v = (t.reshape(length, self.num_heads, -1)
                   for t in jnp.split(_tokenwise(self.c_attn, x), 3, axis=-1))
        if kv is not None:
            kv = k, v = write_cache(kv[0], k, index, 0), write_cache(kv[1], v, index, 0)
        out = attend(q, k, v, mask, q.shape[-1] ** -0.5,
                     functools.partial(self.attn_dropout, key=k1))
        out = self.resid_dropout(_tokenwise(self.c_proj, out.reshape(length, -1)), key=k2)
        return out, kv


class MLP(eqx.Module):
    c_fc: Conv1D
    c_proj: Conv1D
    dropout: eqx.nn.Dropout
    activation: str = eqx.field(static=True)

    def __init__(self, config: GPT2Config, *, key: PRNGKeyArray, dtype=None) -> None:
        k1, k2 = jax.random.split(key)
        self.c_fc = Conv1D(config.n_embd, config.inner, key=k1, dtype=dtype)
        self.c_proj = Conv1D(config.inner, config.n_embd, key=k2, dtype=dtype)
        self.dropout = eqx.nn.Dropout(config.resid_pdrop)
        self.activation = config.activation_function

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        h = activation(self.activation)(_tokenwise(self.c_fc, x))
        return self.dropout(_tokenwise(self.c_proj, h), key=key)


class Block(eqx.Module):
    ln_1: LayerNorm
    attn: Attention
    ln_2: LayerNorm
    mlp: MLP

    def __init__(self, config: GPT2Config, *, key: PRNGKeyArray, dtype=None) -> None:
        k1, k2 = jax.random.split(key)
        self.ln_1 = _layer_norm(config, dtype)
        self.attn = Attention(config, key=k1, dtype=dtype)
        self.ln_2 = _layer_norm(config, dtype)
        self.mlp = MLP(config, key=k2, dtype=dtype)

    def __call__(self, x: Array, mask: Array, kv: KV | None = None, index: Array | int = 0,
                 *, key: PRNGKeyArray | None = None) -> tuple[Array, KV | None]:
        k1, k2 = _keys(key, 2)
        h, kv = self.attn(_tokenwise(self.ln_1, x), mask, kv, index, key=k1)
        x = x + h
        return x + self.mlp(_tokenwise(self.ln_2, x), key=k2), kv


class Transformer(eqx.Module):
    wte: eqx.nn.Embedding
    wpe: eqx.nn.Embedding
    drop: eqx.nn.Dropout
    h: tuple[Block, ...]
    ln_f: LayerNorm

    def __init__(self, config: GPT2Config, *, key: PRNGKeyArray, dtype=None) -> None:
        k1, k2, *kb = jax.random.split(key, 2 + config.n_layer)
        self.wte = eqx.nn.Embedding(config.vocab_size, config.n_embd, key=k1, dtype=dtype)
        self.wpe = eqx.nn.Embedding(config.n_positions, config.n_embd, key=k2, dtype=dtype)
        self.drop = eqx.nn.Dropout(config.embd_pdrop)
        self.h = tuple(Block(config, key=k, dtype=dtype) for k in kb)
        self.ln_f = _layer_norm(config, dtype)


class GPT2(eqx.Module):
    transformer: Transformer
    lm_head: Linear | None  # None: tied to transformer.wte
    config: GPT2Config = eqx.field(static=True)

    def __init__(self, config: GPT2Config, *, key: PRNGKeyArray, dtype=None) -> None:
        dt = dtype_of(dtype)
        k1, k2 = jax.random.split(key)
        self.transformer = Transformer(config, key=k1, dtype=dt)
        self.lm_head = (None if config.tie_word_embeddings else
                        Linear(config.n_embd, config.vocab_size, use_bias=False, key=k2, dtype=dt))
        self.config = config

    def __call__(self, input_ids: Array, *, attention_mask: Array | None = None,
                 position_ids: Array | None = None, key: PRNGKeyArray | None = None,
                 cache: KVCache | None = None) -> Array | tuple[Array, KVCache]:
        """Logits `(L, vocab)` of one sequence of token ids `(L,)`; `attention_mask` `(L,)`
        (0: padding) and `position_ids` `(L,)` (default `0 .. L-1`) as transformers'.

        With a `cache` (`init_cache`) the tokens take its next slots, `attention_mask`
        `(max_length,)` covers every slot, and the call returns `(logits, cache)`."""
        self.config.check_input(input_ids.shape, batched=False)
        t, length = self.transformer, input_ids.shape[0]
        k_embed, *k_blocks = _keys(key, 1 + len(t.h))
        index = 0 if cache is None else cache.index
        positions = index + default_positions(length) if position_ids is None else position_ids
        h = _tokenwise(t.wte, input_ids) + _tokenwise(t.wpe, positions)
        h = t.drop(h, key=k_embed)
        mask = sequence_mask(length, attention_mask, None, index,
                             None if cache is None else cache.max_length)
        written = []
        for i, (block, k) in enumerate(zip(t.h, k_blocks, strict=True)):
            h, kv = block(h, mask, None if cache is None else cache.layer(i), index, key=k)
            written.append(kv)
        h = _tokenwise(t.ln_f, h)
        logits = h @ t.wte.weight.T if self.lm_head is None else _tokenwise(self.lm_head, h)
        return logits if cache is None else (logits, cache.updated(written, length))

    def init_cache(self, max_length: int, dtype=None) -> KVCache:
        """An empty cache of one sequence of up to `max_length` tokens (`dtype`: the
        weights')."""
        cfg = self.config
        dtype = self.transformer.wte.weight.dtype if dtype is None else dtype
        return KVCache.empty(cfg.n_layer, max_length, cfg.n_head, cfg.head_dim, dtype)
