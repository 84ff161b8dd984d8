"""What the decoder-only language models' configs share (GPT-2, the Llama family).

Their input is a batch of token ids `(N, L)` (int32, one layout in every library:
`CHANNELS = False`), their output the logits `(N, L, vocab)`; the call also takes an optional
`attention_mask` `(N, L)` (1 for a token, 0 for padding) and `position_ids` `(N, L)`, as
`transformers`' models do. The task's loss is the next-token cross-entropy
(`zoo.runtime.training.next_token`, padding ignored). `seq_len` is the zoo's own field: the length
of the examples, of the abstract input that traces a model, and of the benchmark's batches; no
weight depends on it. None (the default, and what a `config.json` reads into) stands for
`DEFAULT_LENGTH` tokens, or the model's maximum length if shorter (`length`).

Left padding: `transformers` gives a token the position `0 .. L-1` of its index whatever the
mask, unless `position_ids` say otherwise; its `generate` passes `positions(mask)` (each
sequence counted from its first token), and so must a caller of the zoo's models that wants a
left-padded sequence to give its unpadded logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from canonical.ties import Tie
from zoo.configs import Axis, Config, ConfigError, positive
from zoo.layers.causal import positions as positions  # re-exported: the models' own name
from zoo.models.decoder.spec import DecoderSpec

DEFAULT_LENGTH = 128  # the examples' length when the config does not set `seq_len`
INITIALIZER_RANGE = 0.02  # transformers' `initializer_range` of GPT-2 and the Llama family


def decoder_sizes(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int,
                  head_dim: int | None = None) -> dict[str, int]:
    """transformers' size fields of a decoder-only config (`head_dim` where it is set), for
    the families' named models."""
    sizes = {"hidden_size": hidden, "intermediate_size": intermediate,
             "num_hidden_layers": layers, "num_attention_heads": heads,
             "num_key_value_heads": kv_heads}
    return sizes if head_dim is None else {**sizes, "head_dim": head_dim}


def normal_init(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator
                ) -> dict[str, np.ndarray]:
    """transformers' `_init_weights` for linear layers, `Conv1D` and embeddings: weights
    N(0, initializer_range), biases zero."""
    out = {"weight": INITIALIZER_RANGE * rng.standard_normal(shapes["weight"])}
    return out | ({"bias": np.zeros(shapes["bias"])} if "bias" in shapes else {})


@dataclass(frozen=True)
class LanguageModelConfig(Config):
    """The input, output, loss and tied head of a decoder-only language model; a subclass
    declares the fields `vocab_size`, `seq_len` (int or None) and `tie_word_embeddings`, names
    its token embedding's canonical key (`EMBEDDING`) and configures the shared decoder body
    (`decoder`, `zoo.models.decoder`)."""

    CHANNELS: ClassVar[bool] = False
    INPUT_DTYPE: ClassVar[str] = "int32"
    LOSS: ClassVar[str] = "next_token"
    # transformers' initialisation (PyTorch's defaults would draw N(0, 1) embeddings: a tied
    # head's logits then grow with the width)
    KIND_INITS: ClassVar[dict[str, Any]] = dict.fromkeys(
        ("linear", "hf_conv1d", "embedding"), normal_init)
    GENERATES: ClassVar[bool] = True  # generates text (zoo.runtime.generation); False: an encoder
    EMBEDDING: ClassVar[str]  # the token embedding's canonical key
    HEAD: ClassVar[str] = "lm_head.weight"  # the output head's, when untied

    @property
    def decoder(self) -> DecoderSpec:
        """The options and module names of the shared decoder body (each library's
        `zoo.models.decoder` module builds the model from them)."""
        raise NotImplementedError(f"{type(self).__name__} declares no decoder body")

    @property
    def max_length(self) -> int | None:
        """The longest sequence the weights allow (learned positions), or None (rotary)."""
        return None

    @property
    def length(self) -> int:
        """The examples' length: `seq_len`, else `DEFAULT_LENGTH` (at most `max_length`)."""
        if self.seq_len is not None:
            return self.seq_len
        return min(DEFAULT_LENGTH, self.max_length or DEFAULT_LENGTH)

    def check_lengths(self) -> None:
        if self.seq_len is None:
            return
        positive(f"{self.arch}.seq_len", (self.seq_len,))
        if self.max_length is not None and self.seq_len > self.max_length:
            raise ConfigError(f"{self.arch}.seq_len {self.seq_len} exceeds the "
                              f"{self.max_length} positions the model has")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.length,)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.length, self.vocab_size)

    @property
    def input_axes(self) -> tuple[Axis, ...]:
        return (Axis("L", maximum=self.max_length),)

    @property
    def backbone_prefix(self) -> str:
        """The body's module name and a dot: transformers' base model (`GPT2Model`,
        `LlamaModel`, `BertModel`) saves the body's keys without it."""
        return self.decoder.names.body + "."

    @property
    def ties(self) -> tuple[Tie, ...]:
        """The head tied to the token embedding (`tie_word_embeddings`): one canonical key,
        the embedding's; transformers' `lm_head.weight` beside it loads when equal."""
        return (Tie(self.HEAD, self.EMBEDDING),) if self.tie_word_embeddings else ()

    def sample_input(self, key: Any, batch: int, dtype: Any = None) -> Any:
        """Token ids drawn uniformly from the vocabulary, `(batch, length)` int32 (`dtype`,
        the parameters' dtype of a caller, does not apply to ids)."""
        import jax
        import jax.numpy as jnp

        return jax.random.randint(key, (batch, self.length), 0, self.vocab_size, jnp.int32)
