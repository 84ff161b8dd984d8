"""The Llama family in Flax NNX: batched token ids `(N, L)`; a tied head is
`embed_tokens.attend` (no array of its own). `init_cache` gives the model a KV cache of
`nnx.Cache` variables, as Flax's attention does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from zoo.layers.causal import attend, default_positions, rotary, sequence_mask
from zoo.layers.nnx import RMSNorm, cached_kv, init_kv_cache
from zoo.models.common import dtype_of
from zoo.models.llama.config import LlamaConfig


def _rms_norm(size: int, config: LlamaConfig, dtype: jnp.dtype, rngs: nnx.Rngs) -> RMSNorm:
    return RMSNorm(size, epsilon=config.rms_norm_eps, param_dtype=dtype, rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        e, d, h, g = config.hidden_size, config.dim, config.num_attention_heads, config.kv_heads
        b = config.qkv_biased
        self.num_heads, self.num_kv_heads, self.head_dim = h, g, d
        self.q_proj = nnx.Linear(e, h * d, use_bias=b, param_dtype=dt, rngs=rngs)
        self.k_proj = nnx.Linear(e, g * d, use_bias=b, param_dtype=dt, rngs=rngs)
        self.v_proj = nnx.Linear(e, g * d, use_bias=b, param_dtype=dt, rngs=rngs)
        self.o_proj = nnx.Linear(h * d, e, use_bias=config.attention_bias, param_dtype=dt,
                                 rngs=rngs)
        self.q_norm = _rms_norm(d, config, dt, rngs) if config.qk_norm else None
        self.k_norm = _rms_norm(d, config, dt, rngs) if config.qk_norm else None
        self.cached_key: nnx.Cache | None = nnx.data(None)  # init_kv_cache
        self.cached_value: nnx.Cache | None = nnx.data(None)

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 rope: np.ndarray, index: jax.Array | int = 0) -> jax.Array:
        n, length, _ = x.shape
        q = self.q_proj(x).reshape(n, length, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(n, length, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(n, length, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # per head, over head_dim
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(q, positions, rope), rotary(k, positions, rope)
        k, v = cached_kv(self, k, v, index)
        out = attend(q, k, v, mask, self.head_dim ** -0.5)
        return self.o_proj(out.reshape(n, length, -1))


class MLP(nnx.Module):
    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        e, m, b = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nnx.Linear(e, m, use_bias=b, param_dtype=dt, rngs=rngs)
        self.up_proj = nnx.Linear(e, m, use_bias=b, param_dtype=dt, rngs=rngs)
        self.down_proj = nnx.Linear(m, e, use_bias=b, param_dtype=dt, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(nnx.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.self_attn = Attention(config, rngs=rngs, param_dtype=dt)  # transformers' order
        self.mlp = MLP(config, rngs=rngs, param_dtype=dt)
        self.input_layernorm = _rms_norm(config.hidden_size, config, dt, rngs)
        self.post_attention_layernorm = _rms_norm(config.hidden_size, config, dt, rngs)

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 rope: np.ndarray, index: jax.Array | int = 0) -> jax.Array:
        x = x + self.self_attn(self.input_layernorm(x), positions, mask, rope, index)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nnx.Module):
    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.embed_tokens = nnx.Embed(config.vocab_size, config.hidden_size, param_dtype=dt,
                                      embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
        self.layers = nnx.List([DecoderLayer(config, rngs=rngs, param_dtype=dt)
                                for _ in range(config.num_hidden_layers)])
        self.norm = _rms_norm(config.hidden_size, config, dt, rngs)


class Llama(nnx.Module):
    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.config = config
        self.model = Model(config, rngs=rngs, param_dtype=dt)
        self.lm_head = (None if config.tie_word_embeddings else
                        nnx.Linear(config.hidden_size, config.vocab_size, use_bias=False,
                                   param_dtype=dt, rngs=rngs))
        self.cache_index: nnx.Cache | None = nnx.data(None)  # init_cache

    def init_cache(self, batch: int, max_length: int, dtype=None) -> None:
        """Give the model a KV cache of `batch` sequences of up to `max_length` tokens
        (`nnx.Cache` variables; `dtype`: the weights'). From then on each call takes the next
        slots, its `attention_mask` `(N, max_length)` covering every slot."""
        cfg = self.config
        dtype = self.model.embed_tokens.embedding.dtype if dtype is None else dtype
        for layer in self.model.layers:
            init_kv_cache(layer.self_attn, batch, max_length, cfg.kv_heads, cfg.dim, dtype)
        self.cache_index = nnx.Cache(jnp.zeros((), jnp.int32))

    def __call__(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                 position_ids: jax.Array | None = None,
                 rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
        """Logits `(N, L, vocab)` of token ids `(N, L)`; `attention_mask` `(N, L)` (0: padding)
        and `position_ids` `(N, L)` (default `0 .. L-1`) as transformers'."""
        self.config.check_input(input_ids.shape)
        m, (n, length) = self.model, input_ids.shape
        index, kv_length = 0, None
        if self.cache_index is not None:
            index, kv_length = self.cache_index[...], m.layers[0].self_attn.cached_key.shape[1]
            self.cache_index[...] = index + length
        positions = (index + default_positions(length)[None] if position_ids is None
                     else position_ids)
        positions = jnp.broadcast_to(positions, (n, length))
        mask = sequence_mask(length, attention_mask, self.config.sliding_window, index,
                             kv_length)
        rope = self.config.rope()
        h = m.embed_tokens(input_ids)
        for layer in m.layers:
            h = layer(h, positions, mask, rope, index)
        h = m.norm(h)
        return m.embed_tokens.attend(h) if self.lm_head is None else self.lm_head(h)
