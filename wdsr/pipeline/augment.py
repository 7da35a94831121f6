"""The 8 dihedral transforms (rotations by 90 degrees, with or without a flip), out of place."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_cv2: Any
try:  # OpenCV's SIMD kernels for the byte shuffles, 2-6x numpy's (python -m bench.cv2_kernels); numpy without it
    import cv2 as _cv2
except ImportError:  # pragma: no cover - opencv-python-headless is a dependency
    _cv2 = None

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


def _hwc_reversals(t: int) -> tuple[bool, bool, bool]:
    """For an H x W [x C] source: (reverse its rows when it is cut; reverse its rows, and its
    columns, in the permuting copy into the batch). The rows and columns the transform reverses
    are the output's H and W, which are the source's W and H when it swaps them. numpy's
    permuting copy is as fast with a reversed axis as without, except when a transform that
    keeps H and W reverses exactly one of them (2.4x slower): then the rows are reversed once
    at the cut (a plain row copy) and once more, with the columns, in the permuting copy."""
    swap, flips = _PLAN[t]
    rows, cols = (2 in flips, 1 in flips) if swap else (1 in flips, 2 in flips)
    both = cols and not swap  # the permuting copy reverses rows and columns, never one alone
    return rows != both, both, cols


_HWC_REVERSALS = tuple(_hwc_reversals(t) for t in range(N_DIHEDRAL))
# a planar source's flips, over its own dims: under a swap the output's H and W are its W and H
_PLANAR_FLIPS = tuple(tuple(3 - d for d in flips) if swap else flips for swap, flips in _PLAN)


def _flip_code(rows: bool, cols: bool) -> int | None:
    """cv2.flip's code for reversing rows and/or columns (None: neither)."""
    return -1 if rows and cols else 0 if rows else 1 if cols else None


# With cv2, an H x W [x C] crop's reversals, over its own rows and columns. It is cut with its
# rows reversed (cv2.flip code 0 copies whole rows) and, when ``t`` swaps H and W, transposed
# there too (its columns reversed as the rows of the transpose: one cv2.rotate), so that it is
# held in the batch's orientation; a transpose at the cut, where the crop's rows were just read,
# costs less than one at batch time, when the shuffle buffer has let it go cold. Otherwise its
# columns are reversed when it is written, plane by plane (OpenCV reverses one- and two-byte
# columns with SIMD, three-byte pixels one by one: 2-3x slower). `python -m bench.patch_bench` measures
# each transform.
_CUT_ROWS = tuple((2 in f) if swap else (1 in f) for swap, f in _PLAN)
_CUT_COLS = tuple((1 in f) if swap else (2 in f) for swap, f in _PLAN)
# a planar source's per-plane flip code, over its own rows and columns; under a swap it is done
# after the transpose, in place in the batch row, where rows and columns trade places
_PLANE_FLIPS = tuple(_flip_code(1 in f, 2 in f) for f in _PLANAR_FLIPS)
_TRANSPOSED_FLIPS = tuple(None if c is None else {0: 1, 1: 0, -1: -1}[c] for c in _PLANE_FLIPS)


def _cv2_source(source: np.ndarray) -> bool:
    """Whether an H x W [x C] crop goes the cv2 way (cut and write make the same choice)."""
    return _cv2 is not None and (source.ndim == 2 or source.shape[2] in (1, 3))


def patch_source(view: np.ndarray, t: int, planar: bool = False) -> np.ndarray:
    """What a patch keeps from its cut until it is written into its batch: a planar view as it
    is (it lies in the decoded cache's mapping, which outlives the patch), or the H x W [x C]
    crop copied out of its decoded image: with cv2, its rows reversed when ``t`` reverses them
    and, when ``t`` swaps H and W, transposed (``_CUT_ROWS``, ``_CUT_COLS``); without, its rows
    reversed when ``_hwc_reversals`` says so (a plain row copy)."""
    if not 0 <= t < N_DIHEDRAL:
        raise ValueError(f"dihedral transform index must be 0..7, got {t}")
    if planar:
        return view
    if _cv2_source(view):
        out = _cv2.flip(view, 0) if _CUT_ROWS[t] else None
        if _PLAN[t][0]:
            src = view if out is None else out
            out = _cv2.rotate(src, _cv2.ROTATE_90_COUNTERCLOCKWISE) if _CUT_COLS[t] else _cv2.transpose(src)
            return out.reshape((view.shape[1], view.shape[0]) + view.shape[2:])  # cv2 drops a last axis of 1
        return (np.ascontiguousarray(view) if out is None else out).reshape(view.shape)
    return np.ascontiguousarray(view[::-1] if _HWC_REVERSALS[t][0] else view)


def chw_shape(source: np.ndarray, t: int, planar: bool = False) -> tuple[int, int, int]:
    """The C x H x W shape ``write_chw`` gives ``source`` under ``t``."""
    if planar:
        c, h, w = source.shape
    else:
        h, w = source.shape[:2]
        c = source.shape[2] if source.ndim == 3 else 1
        if _cv2_source(source):  # cut in the batch's orientation
            return (c, h, w)
    return (c, w, h) if _PLAN[t][0] else (c, h, w)


def write_chw(source: np.ndarray, t: int, planar: bool, out: np.ndarray) -> None:
    """Batch time: ``source`` (from ``patch_source``) under transform ``t``, C x H x W, into
    ``out`` (a batch slot's row): the values of ``to_chw(dihedral_view(view, t))``.

    With cv2 (OpenCV's SIMD kernels, 2-6x numpy's for these copies; ``python -m bench.cv2_kernels``): an
    H x W [x C] source, cut in the batch's orientation with its rows reversed, is split into
    ``out``'s planes, and their columns reversed in place when ``t`` reverses them and does not
    swap H and W; a planar source is written plane by plane with one flip, transpose or copy (a
    transpose, then a flip in place in ``out``, when ``t`` does both).

    Without cv2: an H x W [x C] source is one numpy permuting copy, with the reversals
    ``_hwc_reversals`` leaves to it. A planar source is read from the decoded cache here: one copy
    when ``t`` at most reverses its rows (numpy copies reversed rows at memory speed); otherwise it
    is first flipped (torch) or copied into a small contiguous block, and the copy into ``out``
    (the transposing one when ``t`` swaps H and W) reads that block from the CPU cache."""
    swap = _PLAN[t][0]
    if _cv2 is not None:
        if planar:
            code = _PLANE_FLIPS[t]
            for c in range(source.shape[0]):
                plane, dst = source[c], out[c]
                if swap:
                    _cv2.transpose(plane, dst)
                    if code is not None:
                        _cv2.flip(dst, _TRANSPOSED_FLIPS[t], dst)
                elif code is None:
                    np.copyto(dst, plane)
                else:
                    _cv2.flip(plane, code, dst)
            return
        if _cv2_source(source):  # cut in the batch's orientation, its rows reversed
            cols = _CUT_COLS[t] and not swap
            hw = source if source.ndim == 2 else source[:, :, 0] if source.shape[2] == 1 else None
            if hw is not None:
                if cols:
                    _cv2.flip(hw, 1, out[0])
                else:
                    np.copyto(out[0], hw)
                return
            planes = [out[c] for c in range(out.shape[0])]
            _cv2.split(source, planes)
            if cols:
                for plane in planes:
                    _cv2.flip(plane, 1, plane)
            return
    if planar:
        src_flips = _PLANAR_FLIPS[t]
        if not swap and src_flips in ((), (1,)):
            np.copyto(out, source[:, ::-1] if src_flips else source)
            return
        if src_flips in ((), (1,)):
            block = np.ascontiguousarray(source[:, ::-1] if src_flips else source)
        elif source.dtype == np.uint16:  # torch has no flip for uint16: the same bits as int16
            block = torch.from_numpy(source.view(np.int16)).flip(src_flips).numpy().view(np.uint16)
        else:
            block = torch.from_numpy(source).flip(src_flips).numpy()
        np.copyto(out, block.transpose(0, 2, 1) if swap else block)
        return
    _, rows, cols = _HWC_REVERSALS[t]
    a = source[:, :, None] if source.ndim == 2 else source
    if rows:
        a = a[::-1]
    if cols:
        a = a[:, ::-1]
    np.copyto(out, a.transpose(2, 1, 0) if swap else a.transpose(2, 0, 1))


def patch_chw(view: np.ndarray, t: int, planar: bool = False) -> np.ndarray:
    """The contiguous C x H x W patch of ``view`` under transform ``t`` (the same values as
    ``to_chw(dihedral_view(view, t))``, or the same over H and W for a C x H x W ``view``): the
    two steps a patch takes, ``patch_source`` when cut and ``write_chw`` when batched."""
    source = patch_source(view, t, planar)
    out = np.empty(chw_shape(source, t, planar), dtype=view.dtype)
    write_chw(source, t, planar, out)
    return out
