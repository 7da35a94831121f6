"""The 8 dihedral transforms (rotations by 90 degrees, with or without a flip), out of place."""

from __future__ import annotations

import numpy as np

N_DIHEDRAL = 8


def dihedral_view(a: np.ndarray, t: int) -> np.ndarray:
    """View of HxW[xC] ``a`` under transform ``t`` in 0..7: rotate ``t % 4`` quarter turns, flip if ``t >= 4``."""
    if not 0 <= t < N_DIHEDRAL:
        raise ValueError(f"dihedral transform index must be 0..7, got {t}")
    v = np.rot90(a, t % 4, axes=(0, 1))
    return v[:, ::-1] if t >= 4 else v


def to_chw(view: np.ndarray) -> np.ndarray:
    """A contiguous CxHxW copy of an HxW[xC] view: the only copy a patch costs."""
    if view.ndim == 2:
        return np.ascontiguousarray(view[None])
    return np.ascontiguousarray(view.transpose(2, 0, 1))
