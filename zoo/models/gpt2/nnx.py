"""GPT-2 in Flax NNX: batched token ids `(N, L)`; the tied head is `wte.attend` (no array of its
own). `init_cache` gives the model a KV cache of `nnx.Cache` variables, as Flax's attention
does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.causal import attend, default_positions, sequence_mask
from zoo.layers.nnx import Conv1D, LayerNorm, cached_kv, init_kv_cache
from zoo.models.common import activation, dtype_of
from zoo.models.gpt2.config import GPT2Config

Rngs = nnx.Rngs | jax.Array | None


def _layer_norm(config: GPT2Config, dtype: jnp.dtype, rngs: nnx.Rngs) -> LayerNorm:
    return LayerNorm(config.n_embd, epsilon=config.layer_norm_epsilon, param_dtype=dtype,
                     rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, config: GPT2Config, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt, e = dtype_of(param_dtype), config.n_embd
        self.num_heads = config.n_head
        self.c_attn = Conv1D(e, 3 * e, param_dtype=dt, rngs=rngs)
        self.c_proj = Conv1D(e, e, param_dtype=dt, rngs=rngs)
        self.attn_dropout = nnx.Dropout(config.attn_pdrop)
        self.resid_dropout = nnx.Dropout(config.resid_pdrop)
        self.cached_key: nnx.Cache | None = nnx.data(None)  # init_kv_cache
        self.cached_value: nnx.Cache | None = nnx.data(None)

    def __call__(self, x: jax.Array, mask: jax.Array, rngs: Rngs = None,
                 index: jax.Array | int = 0) -> jax.Array:
        n, length, _ = x.shape
        q, k, v = (t.reshape(n, length, self.num_heads, -1)
                   for t in jnp.split(self.c_attn(x), 3, axis=-1))
        k, v = cached_kv(self, k, v, index)
        out = attend(q, k, v, mask, q.shape[-1] ** -0.5,
                     lambda w: self.attn_dropout(w, rngs=rngs))
        return self.resid_dropout(self.c_proj(out.reshape(n, length, -1)), rngs=rngs)


class MLP(nnx.Module):
    def __init__(self, config: GPT2Config, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.activation = config.activation_function
        self.c_fc = Conv1D(config.n_embd, config.inner, param_dtype=dt, rngs=rngs)
        self.c_proj = Conv1D(config.inner, config.n_embd, param_dtype=dt, rngs=rngs)
        self.dropout = nnx.Dropout(config.resid_pdrop)

    def __call__(self, x: jax.Array, rngs: Rngs = None) -> jax.Array:
        h = activation(self.activation)(self.c_fc(x))
        return self.dropout(self.c_proj(h), rngs=rngs)


class Block(nnx.Module):
    def __init__(self, config: GPT2Config, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.ln_1 = _layer_norm(config, dt, rngs)
        self.attn = Attention(config, rngs=rngs, param_dtype=dt)
        self.ln_2 = _layer_norm(config, dt, rngs)
        self.mlp = MLP(config, rngs=rngs, param_dtype=dt)

    def __call__(self, x: jax.Array, mask: jax.Array, rngs: Rngs = None,
                 index: jax.Array | int = 0) -> jax.Array:
        x = x + self.attn(self.ln_1(x), mask, rngs, index)
        return x + self.mlp(self.ln_2(x), rngs)


class Transformer(nnx.Module):
    def __init__(self, config: GPT2Config, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        init = nnx.initializers.normal(1.0)
        self.wte = nnx.Embed(config.vocab_size, config.n_embd, param_dtype=dt,
                             embedding_init=init, rngs=rngs)
        self.wpe = nnx.Embed(config.n_positions, config.n_embd, param_dtype=dt,
                             embedding_init=init, rngs=rngs)
        self.drop = nnx.Dropout(config.embd_pdrop)
        self.h = nnx.List([Block(config, rngs=rngs, param_dtype=dt)
                           for _ in range(config.n_layer)])
        self.ln_f = _layer_norm(config, dt, rngs)


class GPT2(nnx.Module):
    def __init__(self, config: GPT2Config, *, rngs: nnx.Rngs, param_dtype=None) -> None:
        dt = dtype_of(param_dtype)
        self.config = config
        self.transformer = Transformer(config, rngs=rngs, param_dtype=dt)
        self.lm_head = (None if config.tie_word_embeddings else
                        nnx.Linear(config.n_embd, config.vocab_size, use_bias=False,
                                   param_dtype=dt, rngs=rngs))
        self.cache_index: nnx.Cache | None = nnx.data(None)  # init_cache

    def init_cache(self, batch: int, max_length: int, dtype=None) -> None:
        """Give the model a KV cache of `batch` sequences of up to `max_length` tokens
        (`nnx.Cache` variables; `dtype`: the weights'). From then on each call takes the next
        slots, its `attention_mask` `(N, max_length)` covering every slot."""
        cfg = self.config
        dtype = self.transformer.wte.embedding.dtype if dtype is None else dtype
        for block in self.transformer.h:
            init_kv_cache(block.attn, batch, max_length, cfg.n_head, cfg.head_dim, dtype)
        self.cache_index = nnx.Cache(jnp.zeros((), jnp.int32))

    def __call__(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                 position_ids: jax.Array | None = None, rngs: Rngs = None) -> jax.Array:
        """Logits `(N, L, vocab)` of token ids `(N, L)`; `attention_mask` `(N, L)` (0: padding)
        and `position_ids` `(N, L)` (default `0 .. L-1`) as transformers'."""
        self.config.check_input(input_ids.shape)
        t, length = self.transformer, input_ids.shape[1]
        index, kv_length = 0, None
        if self.cache_index is not None:
            index, kv_length = self.cache_index[...], t.h[0].attn.cached_key.shape[1]
            self.cache_index[...] = index + length
        positions = (index + default_positions(length)[None] if position_ids is None
                     else position_ids)
        h = t.drop(t.wte(input_ids) + t.wpe(positions), rngs=rngs)
        mask = sequence_mask(length, attention_mask, None, index, kv_length)
        for block in t.h:
            h = block(h, mask, rngs, index)
        h = t.ln_f(h)
        return t.wte.attend(h) if self.lm_head is None else self.lm_head(h)
