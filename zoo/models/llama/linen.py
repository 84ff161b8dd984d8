"""The Llama family in Flax Linen: batched token ids `(N, L)`; a tied head is
`embed_tokens.attend` (no array of its own). `decode=True` keeps a KV cache in the "cache"
collection, as Flax's attention does."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from zoo.layers.causal import attend, default_positions, rotary, sequence_mask
from zoo.layers.linen import RMSNorm, cache_index, cached_kv
from zoo.models.common import dtype_of
from zoo.models.llama.config import LlamaConfig


def _rms_norm(config: LlamaConfig, dtype: jnp.dtype) -> RMSNorm:
    return RMSNorm(epsilon=config.rms_norm_eps, param_dtype=dtype)


class Attention(nn.Module):
    config: LlamaConfig
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        d, b = cfg.dim, cfg.qkv_biased
        self.q_proj = nn.Dense(cfg.num_attention_heads * d, use_bias=b, param_dtype=dt)
        self.k_proj = nn.Dense(cfg.kv_heads * d, use_bias=b, param_dtype=dt)
        self.v_proj = nn.Dense(cfg.kv_heads * d, use_bias=b, param_dtype=dt)
        self.o_proj = nn.Dense(cfg.hidden_size, use_bias=cfg.attention_bias, param_dtype=dt)
        self.q_norm = _rms_norm(cfg, dt) if cfg.qk_norm else None
        self.k_norm = _rms_norm(cfg, dt) if cfg.qk_norm else None

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 rope: np.ndarray, index: jax.Array | int = 0) -> jax.Array:
        cfg, (n, length, _) = self.config, x.shape
        q = self.q_proj(x).reshape(n, length, cfg.num_attention_heads, cfg.dim)
        k = self.k_proj(x).reshape(n, length, cfg.kv_heads, cfg.dim)
        v = self.v_proj(x).reshape(n, length, cfg.kv_heads, cfg.dim)
        if self.q_norm is not None:  # per head, over head_dim
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(q, positions, rope), rotary(k, positions, rope)
        if self.decode:
            k, v = cached_kv(self, k, v, index)
        out = attend(q, k, v, mask, cfg.dim ** -0.5)
        return self.o_proj(out.reshape(n, length, -1))


class MLP(nn.Module):
    config: LlamaConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        m, b = cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Dense(m, use_bias=b, param_dtype=dt)
        self.up_proj = nn.Dense(m, use_bias=b, param_dtype=dt)
        self.down_proj = nn.Dense(cfg.hidden_size, use_bias=b, param_dtype=dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    config: LlamaConfig
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        dt = dtype_of(self.param_dtype)
        # transformers' definition order (its state_dict's), not the order of the calls
        self.self_attn = Attention(self.config, self.param_dtype, self.decode)
        self.mlp = MLP(self.config, self.param_dtype)
        self.input_layernorm = _rms_norm(self.config, dt)
        self.post_attention_layernorm = _rms_norm(self.config, dt)

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 rope: np.ndarray, index: jax.Array | int = 0) -> jax.Array:
        x = x + self.self_attn(self.input_layernorm(x), positions, mask, rope, index)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    config: LlamaConfig
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        cfg, dt = self.config, dtype_of(self.param_dtype)
        self.embed_tokens = nn.Embed(cfg.vocab_size, cfg.hidden_size, param_dtype=dt,
                                     embedding_init=nn.initializers.normal(1.0))
        self.layers = [DecoderLayer(cfg, self.param_dtype, self.decode)
                       for _ in range(cfg.num_hidden_layers)]
        self.norm = _rms_norm(cfg, dt)

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None,
                 position_ids: jax.Array | None) -> jax.Array:
        """The hidden states after `norm`, `(N, L, hidden_size)`."""
        cfg, (n, length) = self.config, input_ids.shape
        index = cache_index(self, length) if self.decode else 0
        positions = (index + default_positions(length)[None] if position_ids is None
                     else position_ids)
        positions = jnp.broadcast_to(positions, (n, length))
        kv_length = None if attention_mask is None else attention_mask.shape[-1]
        mask = sequence_mask(length, attention_mask, cfg.sliding_window, index, kv_length)
        rope = cfg.rope()
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h, positions, mask, rope, index)
        return self.norm(h)

    def attend(self, h: jax.Array) -> jax.Array:
        """The tied head's logits: `h @ embed_tokens.embedding.T` (`nn.Embed.attend`)."""
        return self.embed_tokens.attend(h)


class Llama(nn.Module):
    """`decode=True`: a KV cache in the "cache" collection, Flax's idiom. `init` with a
    full-length batch `(N, max_length)` creates it (empty); each call then takes the next
    slots, its `attention_mask` `(N, max_length)` covering every slot, `mutable=["cache"]`."""

    config: LlamaConfig
    param_dtype: str = "float32"
    decode: bool = False

    def setup(self) -> None:
        cfg = self.config
        self.model = Model(cfg, self.param_dtype, self.decode)
        self.lm_head = (None if cfg.tie_word_embeddings else
                        nn.Dense(cfg.vocab_size, use_bias=False,
                                 param_dtype=dtype_of(self.param_dtype)))

    def __call__(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                 position_ids: jax.Array | None = None, train: bool = False) -> jax.Array:
        """Logits `(N, L, vocab)` of token ids `(N, L)`; `attention_mask` `(N, L)` (0: padding)
        and `position_ids` `(N, L)` (default `0 .. L-1`) as transformers'."""
        self.config.check_input(input_ids.shape)
        h = self.model(input_ids, attention_mask, position_ids)
        return self.model.attend(h) if self.lm_head is None else self.lm_head(h)
