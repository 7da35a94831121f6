"""The 8 dihedral transforms (rotations by 90 degrees, with or without a flip), out of place."""

from __future__ import annotations

import numpy as np
import torch

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


# transform t -> (swap H and W first?, dims to flip after): rot90 by t % 4, then a flip of W if t >= 4
_PLAN: tuple[tuple[bool, tuple[int, ...]], ...] = (
    (False, ()),
    (True, (1,)),
    (False, (1, 2)),
    (True, (2,)),
    (False, (2,)),
    (True, (1, 2)),
    (False, (1,)),
    (True, ()),
)


def patch_chw(view: np.ndarray, t: int, planar: bool = False) -> np.ndarray:
    """The contiguous C x H x W patch of ``view`` under transform ``t``: the same values as
    ``to_chw(dihedral_view(view, t))`` (the same over H and W for a C x H x W ``view``), made
    with as few and as cheap copies as possible: numpy copies through reversed or transposed
    strides byte by byte, torch's flip and copy kernels are 2-4x faster there. Flips come
    straight from the crop (one copy); transforms that swap H and W first copy the crop out
    contiguous, so the transposing copy reads from the CPU cache."""
    if not 0 <= t < N_DIHEDRAL:
        raise ValueError(f"dihedral transform index must be 0..7, got {t}")
    wide = view.dtype == np.uint16  # torch has no flip for uint16: the same bits as int16
    swap, flips = _PLAN[t]
    if planar:
        a = torch.from_numpy(view.view(np.int16) if wide else view)
        if swap:
            a = a.contiguous().transpose(1, 2)
    else:  # H x W [x C]: the crop's rows copied out, then one copy that moves C first (and swaps H, W)
        a = torch.from_numpy(np.ascontiguousarray(view.view(np.int16) if wide else view))
        if a.dim() == 2:
            a = a.unsqueeze(0)
            if swap:
                a = a.transpose(1, 2)
        else:
            a = a.permute(2, 1, 0) if swap else a.permute(2, 0, 1)
    out = (a.flip(flips) if flips else a).contiguous().numpy()
    return out.view(np.uint16) if wide else out
