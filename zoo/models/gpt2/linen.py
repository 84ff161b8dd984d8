"""GPT-2 in Flax Linen: batched token ids `(N, L)`; the tied head is `wte.attend` (Flax's own
tied-embedding idiom: no array of its own). `decode=True` keeps a KV cache in the "cache"
collection, as Flax's attention does."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.layers.causal import attend, default_positions, sequence_mask
from zoo.layers.linen import Conv1D, LayerNorm, cache_index, cached_kv
from zoo.models.common import activation, dtype_of
from zoo.models.gpt2.config import GPT2Config


def _layer_norm(config: GPT2Config, dtype: jnp.dtype) -> LayerNorm:
    return LayerNorm(epsilon=config.layer_norm_epsilon, param_dtype=dtype)


class Attention(nn.Module):
    config: GPT2Config
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        self.c_attn = Conv1D(3 * cfg.n_embd, param_dtype=dt)
        self.c_proj = Conv1D(cfg.n_embd, param_dtype=dt)
        self.attn_dropout = nn.Dropout(cfg.attn_pdrop)
        self.resid_dropout = nn.Dropout(cfg.resid_pdrop)

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, train: bool,
                 index: jax.Array | int = 0) -> jax.Array:
        n, length, _ = x.shape
        q, k, v = (t.reshape(n, length, self.config.n_head, -1)
                   for t in jnp.split(self.c_attn(x), 3, axis=-1))
        if self.decode:
            k, v = cached_kv(self, k, v, index)
        out = attend(q, k, v, mask, q.shape[-1] ** -0.5,
                     lambda w: self.attn_dropout(w, deterministic=not train))
        return self.resid_dropout(self.c_proj(out.reshape(n, length, -1)),
                                  deterministic=not train)


class MLP(nn.Module):
    config: GPT2Config
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        self.c_fc = Conv1D(cfg.inner, param_dtype=dt)
        self.c_proj = Conv1D(cfg.n_embd, param_dtype=dt)
        self.dropout = nn.Dropout(cfg.resid_pdrop)

    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        h = activation(self.config.activation_function)(self.c_fc(x))
        return self.dropout(self.c_proj(h), deterministic=not train)


class Block(nn.Module):
    config: GPT2Config
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        self.ln_1 = _layer_norm(self.config, dt)
        self.attn = Attention(self.config, self.param_dtype, self.decode)
        self.ln_2 = _layer_norm(self.config, dt)
        self.mlp = MLP(self.config, self.param_dtype)

    def __call__(self, x: jax.Array, mask: jax.Array, train: bool,
                 index: jax.Array | int = 0) -> jax.Array:
        x = x + self.attn(self.ln_1(x), mask, train, index)
        return x + self.mlp(self.ln_2(x), train)


class Transformer(nn.Module):
    config: GPT2Config
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        init = nn.initializers.normal(1.0)
        self.wte = nn.Embed(cfg.vocab_size, cfg.n_embd, param_dtype=dt, embedding_init=init)
        self.wpe = nn.Embed(cfg.n_positions, cfg.n_embd, param_dtype=dt, embedding_init=init)
        self.drop = nn.Dropout(cfg.embd_pdrop)
        self.h = [Block(cfg, self.param_dtype, self.decode) for _ in range(cfg.n_layer)]
        self.ln_f = _layer_norm(cfg, dt)

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None,
                 position_ids: jax.Array | None, train: bool) -> jax.Array:
        """The hidden states after `ln_f`, `(N, L, n_embd)`."""
        length = input_ids.shape[1]
        index = cache_index(self, length) if self.decode else 0
        positions = (index + default_positions(length)[None] if position_ids is None
                     else position_ids)
        h = self.drop(self.wte(input_ids) + self.wpe(positions), deterministic=not train)
        kv_length = None if attention_mask is None else attention_mask.shape[-1]
        mask = sequence_mask(length, attention_mask, None, index, kv_length)
        for block in self.h:
            h = block(h, mask, train, index)
        return self.ln_f(h)

    def attend(self, h: jax.Array) -> jax.Array:
        """The tied head's logits: `h @ wte.embedding.T` (`nn.Embed.attend`)."""
        return self.wte.attend(h)


class GPT2(nn.Module):
    """`decode=True`: a KV cache in the "cache" collection, Flax's idiom. `init` with a
    full-length batch `(N, max_length)` creates it (empty); each call then takes the next
    slots, its `attention_mask` `(N, max_length)` covering every slot, `mutable=["cache"]`."""

    config: GPT2Config
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        cfg = self.config
        self.transformer = Transformer(cfg, self.param_dtype, self.decode)
        self.lm_head = (None if cfg.tie_word_embeddings else
                        nn.Dense(cfg.vocab_size, use_bias=False,
                                 param_dtype=dtype_of(self.param_dtype)))

    def __call__(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                 position_ids: jax.Array | None = None, train: bool = False) -> jax.Array:
        """Logits `(N, L, vocab)` of token ids `(N, L)`; `attention_mask` `(N, L)` (0: padding)
        and `position_ids` `(N, L)` (default `0 .. L-1`) as transformers'."""
        self.config.check_input(input_ids.shape)
        h = self.transformer(input_ids, attention_mask, position_ids, train)
        return self.transformer.attend(h) if self.lm_head is None else self.lm_head(h)
