"""A model's own tokenizer, read from its `tokenizer.json` with the `tokenizers` package (no
network: a local folder, or a Hub repository's files in the Hugging Face cache, as the weights
are read; `zoo.weights.sources.Source`), with what its folder's `tokenizer_config.json` /
`special_tokens_map.json` add to it: the pad token and the longest input
(`model_max_length`). Calling it gives padded, truncated token ids and their attention mask,
as `transformers`' tokenizers do:

    tokenizer = zoo.tokenizer.load("hf-hub:openai/clip-vit-base-patch16")  # or a folder
    ids, mask = tokenizer(["a photo of a cat.", "a photo of a dog."])      # (N, L) int32
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from zoo.weights.sources import LOCAL_DIR, Source, SourceError, read_json

FILE = "tokenizer.json"
SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json")  # the last one read wins
PAD_TOKENS = ("[PAD]", "<pad>", "<|endoftext|>")  # tried in turn when the files name none


class TokenizerError(SourceError):
    """A tokenizer that cannot be read or used (names the file or the argument)."""


class Tokenizer:
    """A `tokenizers.Tokenizer` with its pad token and length limit."""

    def __init__(self, tokenizer: Any, pad_token: str | None = None,
                 model_max_length: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.pad_token = pad_token
        self.model_max_length = model_max_length
        self._copies: dict[int, Any] = {}

    @property
    def pad_id(self) -> int:
        """The pad token's id (0 when the files name none)."""
        if self.pad_token is None:
            return 0
        found = self.tokenizer.token_to_id(self.pad_token)
        if found is None:
            raise TokenizerError(f"the pad token {self.pad_token!r} is not in the vocabulary")
        return found

    def __call__(self, texts: str | Sequence[str], *,
                 padding: Literal["longest", "max_length"] = "longest",
                 max_length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and attention mask `(N, L)` int32 of `texts` (special tokens added as
        the tokenizer's post-processor says), truncated to `max_length` (default the
        folder's `model_max_length`, if any) and right-padded with the pad token to the
        longest text or, `padding="max_length"`, to `max_length`."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise TokenizerError("a tokenizer takes a text or a non-empty list of texts")
        limit = self.model_max_length if max_length is None else max_length
        if limit is not None and limit < 1:
            raise TokenizerError(f"max_length must be positive, found {limit}")
        if padding == "max_length" and limit is None:
            raise TokenizerError("padding='max_length' needs max_length (the tokenizer's files "
                             "give no model_max_length)")
        if padding not in ("longest", "max_length"):
            raise TokenizerError(f"padding {padding!r}: give 'longest' or 'max_length'")
        encoded = [e.ids for e in self._truncating(limit).encode_batch(texts)]
        length = limit if padding == "max_length" else max(map(len, encoded), default=0)
        ids = np.full((len(texts), length), self.pad_id, np.int32)
        mask = np.zeros((len(texts), length), np.int32)
        for row, tokens in enumerate(encoded):
            ids[row, :len(tokens)], mask[row, :len(tokens)] = tokens, 1
        return ids, mask

    def _truncating(self, limit: int | None) -> Any:
        """The tokenizer truncating to `limit` tokens as `tokenizers` truncates (the text,
        its special tokens kept), a copy per limit; the tokenizer itself for none."""
        if limit is None:
            return self.tokenizer
        if limit not in self._copies:
            copy = type(self.tokenizer).from_str(self.tokenizer.to_str())
            copy.enable_truncation(limit)
            self._copies[limit] = copy
        return self._copies[limit]


def _token(value: Any) -> str | None:
    """A special token as the side files write it: a string or {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value


def from_files(tokenizer_json: Path, side_files: Sequence[Path] = ()) -> Tokenizer:
    """The tokenizer of a `tokenizer.json` and the side files beside it (those present)."""
    try:
        from tokenizers import Tokenizer as Rust
    except ImportError:
        raise TokenizerError("tokenizers are read with the tokenizers package (pip install "
                          "tokenizers)") from None
    try:
        rust = Rust.from_file(str(tokenizer_json))
    except Exception as e:  # the library's own parse errors
        raise TokenizerError(f"{tokenizer_json}: not a tokenizer.json the tokenizers package "
                          f"reads ({str(e).splitlines()[0][:120]})") from None
    pad, limit = None, None
    for path in side_files:
        data = read_json(path)
        pad = _token(data.get("pad_token")) or pad
        limit = data.get("model_max_length", limit)
    padding = json.loads(rust.to_str()).get("padding") or {}
    pad = pad or padding.get("pad_token") or next(
        (t for t in PAD_TOKENS if rust.token_to_id(t) is not None), None)
    if not isinstance(limit, int) or limit > 10**9:  # transformers' "no limit" is 1e30
        limit = None
    return Tokenizer(rust, pad, limit)


def load(source: str | Path | Source) -> Tokenizer:
    """The tokenizer of a folder (a path or ``local-dir:PATH``) or a Hub repository
    (``hf-hub:ORG/REPO[@REV]``, read from the Hugging Face cache; with ``HF_HUB_OFFLINE=1``
    only the cache is read). TokenizerError in one line when there is no `tokenizer.json`."""
    where = Source.parse(source) or Source.parse(LOCAL_DIR + str(source))
    found = where.file(FILE)
    if found is None:
        raise TokenizerError(f"{where}: no {FILE} (the zoo reads a model's tokenizer from its "
                          f"{FILE})")
    side = [p for name in SIDE_FILES if (p := where.file(name, optional=True)) is not None]
    return from_files(found, side)
