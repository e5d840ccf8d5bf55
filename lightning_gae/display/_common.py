"""What both picture families share: array conversion, the white background and the padding between parts."""

from __future__ import annotations

from typing import Union

import numpy as np
from torch import Tensor

__all__ = ["PAD_PX", "WHITE", "ArrayLike", "as_numpy", "as_uint8"]

ArrayLike = Union[np.ndarray, Tensor]
PAD_PX = 6
"""Blank pixels around and between the parts of a picture."""
WHITE = 255


def as_numpy(x: ArrayLike) -> np.ndarray:
    """A numpy view of an array, or of a tensor (detached, on the CPU)."""
    return x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)


def as_uint8(image: ArrayLike) -> np.ndarray:
    """``[H, W, 3]`` uint8 from uint8 or from floats in [0, 1]."""
    array = as_numpy(image)
    if array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"expected an RGB image [H, W, 3], got shape {array.shape}")
    if array.dtype == np.uint8:
        return array
    return (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
