"""What a decoder-only language model declares to the shared body: transformers' module names
(`Names`) and the options of its layers (`DecoderSpec`). No library is imported here.

The body is embedding (+ learned positions) -> dropout -> blocks -> final norm -> head (tied
to the embedding or `lm_head`). A block's modules play roles (`ROLES`): `attention_norm`,
`attention`, `mlp_norm`, `mlp`; a block computes `x + attention(attention_norm(x))`, then
`x + mlp(mlp_norm(x))`, each branch followed by the residual dropout. Each kind of layer is
one entry of a table per library, chosen by the spec's kind:

- norm (`norm`): `layer_norm` (weight and bias) or `rms_norm` (transformers' `LlamaRMSNorm`);
- attention (`AttentionSpec.layout`): `c_attn` (GPT-2's fused `c_attn` and `c_proj`,
  transformers' `Conv1D`) or `qkvo` (`q_proj`, `k_proj`, `v_proj`, `o_proj` linear layers,
  optional per-head `q_norm` / `k_norm`); grouped key/value heads, biases, a sliding window;
- MLP (`MLPSpec.kind`): `c_fc` (`c_fc` -> activation -> `c_proj`, `Conv1D`) or `gated`
  (`down_proj(act(gate_proj(x)) * up_proj(x))`);
- positions: learned absolute (`Names.positions`, `max_positions` rows) or rotary (`rope`,
  the inverse frequencies), or both absent.

A new family adds its names and, where its arithmetic is new, a kind to these tables (e.g. a
norm with `(1 + weight)`, a fused `qkv_proj`, a mixture of experts), never a branch on the
family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

ROLES = ("attention_norm", "attention", "mlp_norm", "mlp")


@dataclass(frozen=True)
class Names:
    """transformers' module names: the body's (`body.embedding`, `body.layers.0`, ...), each
    block's as `(name, role)` pairs in transformers' definition order (its `state_dict`'s)."""

    body: str  # "transformer" (GPT-2), "model" (Llama)
    embedding: str
    layers: str
    norm: str  # the final norm
    block: tuple[tuple[str, str], ...]
    positions: str | None = None  # learned absolute position embedding

    def __post_init__(self) -> None:
        roles = sorted(role for _, role in self.block)
        if roles != sorted(ROLES):
            raise ValueError(f"a block needs one module per role {ROLES}, found {roles}")


@dataclass(frozen=True)
class AttentionSpec:
    """The attention's layout and options (`c_attn`: transformers' `Conv1D`, always biased;
    `qkvo`: biases as `qkv_bias` and `out_bias`)."""

    layout: Literal["c_attn", "qkvo"]
    heads: int
    kv_heads: int
    head_dim: int
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norm: bool = False  # per-head norms of queries and keys, before the rotary embedding
    sliding_window: int | None = None
    dropout: float = 0.0  # on the attention weights, in training


@dataclass(frozen=True)
class MLPSpec:
    """The MLP's kind, width and activation (`c_fc`: `Conv1D`, always biased; `gated`: biases
    as `bias`)."""

    kind: Literal["c_fc", "gated"]
    width: int
    activation: str
    bias: bool = False


@dataclass(frozen=True)
class DecoderSpec:
    """Everything the body of a family needs from its config (a config's `decoder`)."""

    names: Names
    vocab_size: int
    hidden_size: int
    num_layers: int
    norm: Literal["layer_norm", "rms_norm"]
    norm_eps: float
    attention: AttentionSpec
    mlp: MLPSpec
    max_positions: int | None = None  # rows of the learned position embedding
    rope: tuple[float, ...] | None = None  # rotary inverse frequencies (float32 values)
    embedding_dropout: float = 0.0
    residual_dropout: float = 0.0  # after each block's attention and MLP
    tie_word_embeddings: bool = False

    @property
    def inv_freq(self) -> np.ndarray | None:
        """The rotary inverse frequencies `(head_dim / 2,)` float32, or None."""
        return None if self.rope is None else np.asarray(self.rope, np.float32)

    def role(self, role: str) -> str:
        """The name of the block's module playing `role`."""
        return next(name for name, r in self.names.block if r == role)
