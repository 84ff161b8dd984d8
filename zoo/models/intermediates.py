"""timm's `forward_intermediates` conventions, shared by every library's models: which taps
to take (`take_indices`, timm's `feature_take_indices`) and the layouts a tap is returned in.

A layout is written as timm's `output_fmt`: "NCHW", "NHWC", or "NLC" (a ViT's tokens,
not reshaped). Equinox models are per sample: the same names, without the batch axis "N".
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

MAPS: tuple[str, ...] = ("NCHW", "NHWC")  # feature maps
TOKENS: tuple[str, ...] = (*MAPS, "NLC")  # a ViT's tokens also as they are


def take_indices(count: int, indices: int | Sequence[int] | None) -> tuple[list[int], int]:
    """(the taps to take, in ascending positions from 0, the last of them) out of `count`:
    all of them for None, the last `indices` for an int, those listed (negative from the
    end) for a sequence. Raises ValueError naming the bad index and the valid range."""
    if indices is None:
        indices = count
    if not isinstance(indices, Sequence):
        indices = _index(indices)
        if not 0 < indices <= count:
            raise ValueError(f"forward_intermediates: indices={indices} asks for the last "
                             f"{indices} of {count} taps; use 1 to {count}")
        return list(range(count - indices, count)), count - 1
    take = []
    for i in map(_index, indices):
        if not -count <= i < count:
            raise ValueError(f"forward_intermediates: index {i} is out of range; {count} "
                             f"taps take -{count} to {count - 1}")
        take.append(i % count)
    if not take:
        raise ValueError("forward_intermediates: indices is empty; give None, an int or "
                         "some of the tap positions")
    return sorted(set(take)), max(take)


def _index(i: object) -> int:
    try:
        return operator.index(i)
    except TypeError:
        raise ValueError(f"forward_intermediates: indices takes ints, found {i!r}") from None


def check_format(output_fmt: str, formats: Sequence[str]) -> None:
    """Raise ValueError unless `output_fmt` is one of `formats`."""
    if output_fmt not in formats:
        raise ValueError(f"forward_intermediates: output_fmt {output_fmt!r} is not one of "
                         f"{', '.join(formats)}")


def permutation(src: str, dst: str, *, batched: bool = True) -> tuple[int, ...]:
    """The axes that turn an array laid out as `src` into `dst` ("NHWC" to "NCHW": (0, 3, 1,
    2)); per sample (`batched=False`) both without "N"."""
    if not batched:
        src, dst = src.replace("N", ""), dst.replace("N", "")
    return tuple(src.index(axis) for axis in dst)
