"""PyTorch tensors and numpy arrays, dtype kept (bfloat16 through ml_dtypes)."""

from __future__ import annotations

from typing import Any

import numpy as np


def torch_to_numpy(t: Any) -> np.ndarray:
    """A torch tensor as a numpy array of the same dtype."""
    import ml_dtypes
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def numpy_to_torch(a: Any, *, share: bool = False) -> Any:
    """A numpy (or JAX) array as a torch tensor of the same dtype: a new one, or with `share`
    one sharing a writable, contiguous array's memory (e.g. a memory-mapped file's pages)."""
    import ml_dtypes
    import torch

    a = np.asarray(a)
    shared = share and a.flags.writeable and a.flags.c_contiguous and a.flags.aligned
    if a.dtype == ml_dtypes.bfloat16:
        bits = a.view(np.int16)
        return torch.from_numpy(bits if shared else bits.copy()).view(torch.bfloat16)
    return torch.from_numpy(a if shared else np.array(a, copy=True))
