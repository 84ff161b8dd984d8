"""The Llama family in Equinox: one sequence of token ids `(L,)` per call, batched with vmap;
a tied head is `h @ embed_tokens.weight.T` (no array of its own). Decoding threads an explicit
`KVCache` through the call (`init_cache`)."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.causal import attend, default_positions, rotary, sequence_mask, write_cache
from zoo.layers.eqx import KVCache, Linear, RMSNorm
from zoo.models.common import dtype_of
from zoo.models.llama.config import LlamaConfig

KV = tuple[Array, Array]  # one layer's cached keys and values


def _rms_norm(size: int, config: LlamaConfig, dtype) -> RMSNorm:
    return RMSNorm(size, eps=config.rms_norm_eps, use_bias=False, dtype=dtype)


def _tokenwise(layer: eqx.Module, x: Array) -> Array:
    return jax.vmap(layer)(x)


class Attention(eqx.Module):
    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    q_norm: RMSNorm | None
    k_norm: RMSNorm | None
    num_heads: int = eqx.field(static=True)
    num_kv_heads: int = eqx.field(static=True)
    head_dim: int = eqx.field(static=True)

    def __init__(self, config: LlamaConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        kq, kk, kv, ko = jax.random.split(key, 4)
        e, d, h, g = config.hidden_size, config.dim, config.num_attention_heads, config.kv_heads
        b = config.qkv_biased
        self.q_proj = Linear(e, h * d, use_bias=b, key=kq, dtype=dtype)
        self.k_proj = Linear(e, g * d, use_bias=b, key=kk, dtype=dtype)
        self.v_proj = Linear(e, g * d, use_bias=b, key=kv, dtype=dtype)
        self.o_proj = Linear(h * d, e, use_bias=config.attention_bias, key=ko, dtype=dtype)
        self.q_norm = _rms_norm(d, config, dtype) if config.qk_norm else None
        self.k_norm = _rms_norm(d, config, dtype) if config.qk_norm else None
        self.num_heads, self.num_kv_heads, self.head_dim = h, g, d

    def __call__(self, x: Array, positions: Array, mask: Array, rope: np.ndarray,
                 kv: KV | None = None, index: Array | int = 0) -> tuple[Array, KV | None]:
        """The attention's output and, given the cached `kv`, the cache with this call's keys
        and values written at `index`."""
        length = x.shape[0]
        q = _tokenwise(self.q_proj, x).reshape(length, self.num_heads, self.head_dim)
        k = _tokenwise(self.k_proj, x).reshape(length, self.num_kv_heads, self.head_dim)
        v = _tokenwise(self.v_proj, x).reshape(length, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # per head, over head_dim
            q = jax.vmap(jax.vmap(self.q_norm))(q)
            k = jax.vmap(jax.vmap(self.k_norm))(k)
        q, k = rotary(q, positions, rope), rotary(k, positions, rope)
        if kv is not None:
            kv = k, v = write_cache(kv[0], k, index, 0), write_cache(kv[1], v, index, 0)
        out = attend(q, k, v, mask, self.head_dim ** -0.5)
        return _tokenwise(self.o_proj, out.reshape(length, -1)), kv


class MLP(eqx.Module):
    gate_proj: Linear
    up_proj: Linear
    down_proj: Linear

    def __init__(self, config: LlamaConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        e, m, b = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = Linear(e, m, use_bias=b, key=k1, dtype=dtype)
        self.up_proj = Linear(e, m, use_bias=b, key=k2, dtype=dtype)
        self.down_proj = Linear(m, e, use_bias=b, key=k3, dtype=dtype)

    def __call__(self, x: Array) -> Array:  # one token
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(eqx.Module):
    self_attn: Attention  # transformers' definition order (its state_dict's)
    mlp: MLP
    input_layernorm: RMSNorm
    post_attention_layernorm: RMSNorm

    def __init__(self, config: LlamaConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        k1, k2 = jax.random.split(key)
        self.self_attn = Attention(config, key=k1, dtype=dtype)
        self.mlp = MLP(config, key=k2, dtype=dtype)
        self.input_layernorm = _rms_norm(config.hidden_size, config, dtype)
        self.post_attention_layernorm = _rms_norm(config.hidden_size, config, dtype)

    def __call__(self, x: Array, positions: Array, mask: Array, rope: np.ndarray,
                 kv: KV | None = None, index: Array | int = 0) -> tuple[Array, KV | None]:
        h, kv = self.self_attn(_tokenwise(self.input_layernorm, x), positions, mask, rope, kv,
                               index)
        x = x + h
        return x + jax.vmap(lambda t: self.mlp(self.post_attention_layernorm(t)))(x), kv


class Model(eqx.Module):
    embed_tokens: eqx.nn.Embedding
    layers: tuple[DecoderLayer, ...]
    norm: RMSNorm

    def __init__(self, config: LlamaConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        ke, *kl = jax.random.split(key, 1 + config.num_hidden_layers)
        self.embed_tokens = eqx.nn.Embedding(config.vocab_size, config.hidden_size, key=ke,
                                             dtype=dtype)
        self.layers = tuple(DecoderLayer(config, key=k, dtype=dtype) for k in kl)
        self.norm = _rms_norm(config.hidden_size, config, dtype)


class Llama(eqx.Module):
    model: Model
    lm_head: Linear | None  # None: tied to model.embed_tokens
    config: LlamaConfig = eqx.field(static=True)

    def __init__(self, config: LlamaConfig, *, key: PRNGKeyArray, dtype=None) -> None:
        dt = dtype_of(dtype)
        k1, k2 = jax.random.split(key)
        self.model = Model(config, key=k1, dtype=dt)
        self.lm_head = (None if config.tie_word_embeddings else
                        Linear(config.hidden_size, config.vocab_size, use_bias=False, key=k2,
                               dtype=dt))
        self.config = config

    def __call__(self, input_ids: Array, *, attention_mask: Array | None = None,
                 position_ids: Array | None = None, key: PRNGKeyArray | None = None,
                 cache: KVCache | None = None) -> Array | tuple[Array, KVCache]:
        """Logits `(L, vocab)` of one sequence of token ids `(L,)`; `attention_mask` `(L,)`
        (0: padding) and `position_ids` `(L,)` (default `0 .. L-1`) as transformers'.

        With a `cache` (`init_cache`) the tokens take its next slots, `attention_mask`
        `(max_length,)` covers every slot, and the call returns `(logits, cache)`."""
        del key  # no dropout
        self.config.check_input(input_ids.shape, batched=False)
        m, length = self.model, input_ids.shape[0]
        index = 0 if cache is None else cache.index
        positions = index + default_positions(length) if position_ids is None else position_ids
        mask = sequence_mask(length, attention_mask, self.config.sliding_window, index,
                             None if cache is None else cache.max_length)
        rope = self.config.rope()
        h = _tokenwise(m.embed_tokens, input_ids)
        written = []
        for i, layer in enumerate(m.layers):
            h, kv = layer(h, positions, mask, rope, None if cache is None else cache.layer(i),
                          index)
            written.append(kv)
        h = _tokenwise(m.norm, h)
        logits = (h @ m.embed_tokens.weight.T if self.lm_head is None
                  else _tokenwise(self.lm_head, h))
        return logits if cache is None else (logits, cache.updated(written, length))

    def init_cache(self, max_length: int, dtype=None) -> KVCache:
        """An empty cache of one sequence of up to `max_length` tokens (`dtype`: the
        weights')."""
        cfg = self.config
        dtype = self.model.embed_tokens.weight.dtype if dtype is None else dtype
        return KVCache.empty(cfg.num_hidden_layers, max_length, cfg.kv_heads, cfg.dim, dtype)
