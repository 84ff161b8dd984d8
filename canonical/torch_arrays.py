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


def numpy_to_torch(a: Any) -> Any:
    """A numpy (or JAX) array as a new torch tensor of the same dtype."""
    import ml_dtypes
    import torch

    a = np.asarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))
