"""Flax explicit conv-transpose padding pairs back to PyTorch (padding, output_padding)."""

from __future__ import annotations

from collections.abc import Sequence


def flax_to_torch_padding(
    pairs: Sequence[tuple[int, int]], kernel_size: Sequence[int], dilation: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Invert `torch_padding`: pairs `(d(k-1) - p, d(k-1) - p + op)` -> `(p, op)` per dim.

    Raises ValueError for string padding or pairs no PyTorch layer can express.
    """
    if isinstance(pairs, str) or any(not isinstance(p, tuple | list) for p in pairs):
        raise ValueError(f"explicit (low, high) padding pairs required, got {pairs!r}")
    padding = tuple(d * (k - 1) - lo for (lo, _), k, d in zip(pairs, kernel_size, dilation,
                                                              strict=True))
    output_padding = tuple(hi - lo for lo, hi in pairs)
    if any(op < 0 for op in output_padding):
        raise ValueError(f"padding pairs {pairs} have high < low: not a PyTorch conv-transpose")
    return padding, output_padding
