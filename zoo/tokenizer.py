"""A model's own tokenizer without the network: its `tokenizer.json` (the `tokenizers`
package's format, which transformers' fast tokenizers read too) from a local folder or the
Hugging Face cache, padded and truncated as transformers pads a batch.

    tok = zoo.tokenizer.load("hf-hub:sentence-transformers/all-MiniLM-L6-v2")  # or a folder
    ids, mask = tok.encode(["a sentence", "another one"], max_length=128)  # (N, L) int32

A source is a folder, ``local-dir:PATH`` or ``hf-hub:ORG/REPO[@REVISION]`` (`zoo.weights.sources`:
the cache's files checked, ``HF_HUB_OFFLINE`` honoured). `tokenizer_config.json`, when present,
gives the padding token and `model_max_length` as transformers reads them; the padding token
is otherwise the one `tokenizer.json`'s own padding names, else the first of `PAD_TOKENS`
the vocabulary has.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo.weights.sources import Source, SourceError, read_json

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
PAD_TOKENS = ("[PAD]", "<pad>", "<|endoftext|>")
UNBOUNDED = 10**20  # transformers' model_max_length when a tokenizer sets none


class TokenizerError(ValueError):
    """A tokenizer that cannot be read or used (names the file or the argument)."""


@dataclass(frozen=True)
class Tokenizer:
    """A `tokenizers.Tokenizer` with its padding token and longest input (`max_length`,
    None: unbounded); `encode` pads each batch to its longest sequence (right)."""

    backend: Any
    pad_id: int
    pad_token: str
    max_length: int | None = None

    def encode(self, texts: str | Sequence[str], max_length: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """(ids, attention_mask), both `(N, L)` int32, of `texts` with the special tokens
        (BERT's [CLS] ... [SEP]), truncated to `max_length` (default: the tokenizer's) and
        padded to the longest."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise TokenizerError("encode takes a text or a non-empty list of texts")
        limit = max_length if max_length is not None else self.max_length
        if limit is not None and limit < 1:
            raise TokenizerError(f"max_length must be positive, found {limit}")
        tok = self.backend.__class__.from_str(self.backend.to_str())  # the caller's untouched
        tok.no_truncation() if limit is None else tok.enable_truncation(limit)
        tok.enable_padding(pad_id=self.pad_id, pad_token=self.pad_token)
        out = tok.encode_batch(texts)
        return (np.array([e.ids for e in out], np.int32),
                np.array([e.attention_mask for e in out], np.int32))


def load(path_or_repo: str | os.PathLike) -> Tokenizer:
    """The tokenizer of a folder, ``local-dir:PATH`` or ``hf-hub:ORG/REPO[@REVISION]`` (from
    the Hugging Face cache); TokenizerError naming the missing file otherwise."""
    try:
        from tokenizers import Tokenizer as Backend
    except ImportError:
        raise TokenizerError("reading tokenizer.json needs the tokenizers package (pip install "
                             "tokenizers)") from None
    folder = _folder(path_or_repo)
    path = folder / TOKENIZER
    if not path.is_file():
        raise TokenizerError(f"{path_or_repo}: no {TOKENIZER}")
    try:
        backend = Backend.from_file(str(path))
    except Exception as e:  # the Rust parser's errors
        raise TokenizerError(f"{path}: not a tokenizers file ({str(e)[:120]})") from None
    settings = _settings(folder / TOKENIZER_CONFIG)
    pad = settings.get("pad_token") or _own_pad(backend) or next(
        (t for t in PAD_TOKENS if backend.token_to_id(t) is not None), None)
    if isinstance(pad, dict):  # an AddedToken as transformers writes it
        pad = pad.get("content")
    pad_id = None if pad is None else backend.token_to_id(pad)
    if pad_id is None:
        raise TokenizerError(f"{path}: no padding token (tried {pad or ', '.join(PAD_TOKENS)})")
    longest = settings.get("model_max_length")
    longest = longest if isinstance(longest, int) and 0 < longest < UNBOUNDED else None
    return Tokenizer(backend, pad_id, pad, longest)


def _folder(path_or_repo: str | os.PathLike) -> Path:
    """The local folder holding the tokenizer's files (the cache's, for a Hub source)."""
    source = Source.parse(path_or_repo)
    if source is None:
        folder = Path(path_or_repo).expanduser()
        if not folder.is_dir():
            raise TokenizerError(f"{path_or_repo}: not a folder (give a folder, local-dir:PATH "
                                 "or hf-hub:ORG/REPO)")
        return folder
    try:
        found = source.file(TOKENIZER)
        if found is None:
            raise TokenizerError(f"{source}: the repository has no {TOKENIZER}")
        source.file(TOKENIZER_CONFIG)  # beside it in the cache, when the repository has one
    except SourceError as e:
        raise TokenizerError(str(e)) from None
    return found.parent


def _settings(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return read_json(path)
    except SourceError as e:
        raise TokenizerError(str(e)) from None


def _own_pad(backend: Any) -> str | None:
    padding = backend.padding
    return None if padding is None else padding.get("pad_token")
