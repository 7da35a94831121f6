"""The LR of part of an image, MATLAB-exactly: ``crop_lr`` (a patch, a band or a region of an image
read through a callback) and ``downscale_part`` (the LR rows and columns asked for of an array), equal
bit for bit to the crop of ``resize.downscale`` of the whole mod-cropped image.

``downscale_part`` computes only the LR pixels asked for: the HR is turned into float64 once and split
by phase, so each tap of the shift-invariant outputs is one multiply by a scalar and one add on a
contiguous view, in MATLAB's order (rows first, taps in order, float64); the mirrored outputs at the
image border take the gathered path of ``resize``. Weights come from ``resize.contributions``.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from shardmaker.imaging.resize import BLOCK_BYTES, ResizeMethod, check_image, contributions

__all__ = ["BAND_PIXELS", "crop_lr", "downscale_part"]


# ---- the LR of part of an image ---------------------------------------------------------------
BAND_PIXELS = 1 << 22  # HR pixels per band of crop_lr, read at once (the float64 work is in chunks of _SCRATCH_BYTES)


class _Box(NamedTuple):
    y: int
    x: int
    h: int
    w: int


def crop_lr(
    read: Callable[[int, int, int, int], np.ndarray],
    image_hw: tuple[int, int],
    box: tuple[int, int, int, int],
    scale: int,
    method: ResizeMethod = ResizeMethod.MATLAB,
    band_pixels: int = BAND_PIXELS,
) -> np.ndarray:
    """The x``scale`` LR of the HR ``box`` = (y, x, h, w) of an image of ``image_hw``: the crop of
    ``downscale(mod_crop(image))`` it covers, bit for bit, computed from the box and a margin of
    ``3 * s`` HR pixels read through ``read(y, x, h, w)`` (never the whole image), in bands of about
    ``band_pixels`` HR pixels, so one band is read at a time, not the box (``downscale_part`` computes
    just its LR pixels, a few LR rows at a time). The box starts on the x``scale`` grid. Used for region
    samples (``shardmaker build --region``) and for LR made per patch (``SRDataset(lr="bicubic")``)."""
    region = _Box(*box)
    s = scale
    if region.y % s or region.x % s:
        raise ValueError(f"region at ({region.x}, {region.y}) is not on the x{s} grid")
    hc, wc = image_hw[0] // s * s, image_hw[1] // s * s  # the mod-cropped image the LR is made from
    y1, x1 = min(region.y + region.h, hc), min(region.x + region.w, wc)
    if y1 <= region.y or x1 <= region.x:
        raise ValueError(f"region {region} has no x{s} LR in a {image_hw[1]}x{image_hw[0]} image")
    lh = (y1 - region.y) // s
    rows = max(1, band_pixels // (x1 - region.x) // s)  # LR rows per band
    out: np.ndarray | None = None
    for r0 in range(0, lh, rows):
        r1 = min(lh, r0 + rows)
        part = _band_lr(read, (hc, wc), (region.y + r0 * s, region.y + r1 * s), (region.x, x1), s, method)
        if out is None:
            out = np.empty((lh, *part.shape[1:]), part.dtype)
        out[r0:r1] = part
    assert out is not None
    return out


def _band_lr(
    read: Callable[[int, int, int, int], np.ndarray],
    crop_hw: tuple[int, int],
    ys: tuple[int, int],
    xs: tuple[int, int],
    s: int,
    method: ResizeMethod,
) -> np.ndarray:
    """LR rows ``ys // s`` x columns ``xs // s`` of the mod-cropped image ``crop_hw``, from those HR
    pixels and a margin of ``3 * s`` (the bicubic kernel reaches ``2 * s + 1`` at ``1/s``) clipped to
    the crop, so each LR pixel sees what it sees in the whole image, the mirroring at its border too."""
    m = 3 * s
    ty, tx = max(0, ys[0] - m), max(0, xs[0] - m)
    by, bx = min(crop_hw[0], ys[1] + m), min(crop_hw[1], xs[1] + m)
    rows = ((ys[0] - ty) // s, (ys[1] - ys[0]) // s)
    cols = ((xs[0] - tx) // s, (xs[1] - xs[0]) // s)
    return downscale_part(read(ty, tx, by - ty, bx - tx), s, rows, cols, method)


# ---- part of the LR of an image: tap passes on contiguous views ---------------------------------
class _Taps(NamedTuple):
    """The ``n`` LR samples ``[o0, o0 + n)`` of an axis of ``length`` HR samples at ``1/s``: which HR samples
    ``[lo, hi)`` they read (both on the x``s`` grid) and how, from those split by phase (HR sample
    ``lo + s * q + p`` at ``[p, q]``). Outputs ``[first, last)`` are the shift-invariant ones: tap ``k``
    of output ``first + i`` is ``weights[k]`` times ``[phase[k], start[k] + i]``. The few others
    (mirrored at the border) are ``rows``: tap ``k`` of each is ``row_w[:, k]`` times flat sample
    ``row_ix[:, k]`` (``p * (hi - lo) // s + q``)."""

    n: int
    lo: int
    hi: int
    weights: tuple[np.float64, ...]
    first: int
    last: int
    phase: tuple[int, ...]
    start: tuple[int, ...]
    rows: np.ndarray
    row_w: np.ndarray
    row_ix: np.ndarray


@functools.lru_cache(maxsize=128)
def _taps(length: int, s: int, o0: int, n: int) -> _Taps:
    """The taps of :func:`contributions` for ``length -> length // s`` (MATLAB's), sorted into the
    shift-invariant outputs and the rest; cached: a patch stream asks for a few geometries only."""
    out_len = length // s
    w_all, ix_all = contributions(length, out_len, 1 / s)
    w, ix = w_all[o0 : o0 + n], ix_all[o0 : o0 + n]
    mid = out_len // 2  # an output away from both borders, if the axis has one
    offs = ix_all[mid] - s * mid  # there, tap k of output i reads HR sample s * i + offs[k]
    ok = np.all(w == w_all[mid], axis=1) & np.all(ix == s * np.arange(o0, o0 + n)[:, None] + offs, axis=1)
    good = np.flatnonzero(ok)
    first, last = (int(good[0]), int(good[-1]) + 1) if good.size else (0, 0)
    lo, hi = int(ix.min()) // s * s, -(-(int(ix.max()) + 1) // s) * s
    at = [int(v) + s * (o0 + first) - lo for v in offs]  # tap k of output `first`, from lo
    rows = np.flatnonzero(~ok)
    rel = ix[rows] - lo
    row_ix = rel % s * ((hi - lo) // s) + rel // s
    for arr in (rows, w[rows], row_ix):
        arr.flags.writeable = False
    weights = tuple(np.float64(v) for v in w_all[mid])  # numpy scalars: a Python float costs each multiply ~1 us
    return _Taps(n, lo, hi, weights, first, last, tuple(a % s for a in at), tuple(a // s for a in at), rows, w[rows], row_ix)


def _by_phase(a: np.ndarray, s: int) -> np.ndarray:
    """A view of ``a`` (``s * q`` rows first) as ``[p, q, ...]`` = row ``s * q + p``."""
    return a.reshape(a.shape[0] // s, s, *a.shape[1:]).swapaxes(0, 1)


def _tap_pass(x: np.ndarray, t: _Taps, out: np.ndarray) -> None:
    """``out[i] = sum_k w[i, k] * sample(i, k)`` along axis 1 of ``x`` (``[p, q, m]``, float64), summed
    in tap order in float64 as ``_resize_axis0`` (MATLAB) does; the shift-invariant outputs as one
    multiply and one add per tap on contiguous views, in row blocks that stay in cache."""
    cols = out.shape[1]
    block = max(1, BLOCK_BYTES // (8 * cols))
    tmp = _scratch(2, (min(block, max(t.last - t.first, 1)), cols))
    w, ph, st = t.weights, t.phase, t.start
    for r0 in range(t.first, t.last, block):
        r1 = min(t.last, r0 + block)
        acc, tmp_v, d = out[r0:r1], tmp[: r1 - r0], r0 - t.first
        np.multiply(x[ph[0], st[0] + d : st[0] + d + r1 - r0], w[0], out=acc)
        for k in range(1, len(w)):
            np.multiply(x[ph[k], st[k] + d : st[k] + d + r1 - r0], w[k], out=tmp_v)
            np.add(acc, tmp_v, out=acc)
    if t.rows.size:  # mirrored at the border: gathered, as _resize_axis0 does
        flat = x.reshape(-1, cols)
        acc = flat[t.row_ix[:, 0]] * t.row_w[:, :1]
        for k in range(1, len(w)):
            acc += flat[t.row_ix[:, k]] * t.row_w[:, k : k + 1]
        out[t.rows] = acc


_SCRATCH_BYTES = 1 << 23  # float64 work arrays up to this size are kept per thread and reused
_local = threading.local()


def _scratch(slot: int, shape: tuple[int, ...]) -> np.ndarray:
    """A float64 work array of ``shape`` (contents undefined): a patch-sized one is reused from this
    thread's slot ``slot``, since a fresh megabyte each patch costs its page faults (~1 ms a patch)."""
    size = math.prod(shape)
    if 8 * size > _SCRATCH_BYTES:
        return np.empty(shape)
    bufs: dict[int, np.ndarray] = _local.__dict__.setdefault("bufs", {})
    buf = bufs.get(slot)
    if buf is None or buf.size < size:
        buf = bufs[slot] = np.empty(size)
    return buf[:size].reshape(shape)


def _round_u8(a: np.ndarray) -> None:
    """imresizemex's uint8 store, in place: round half away from zero, saturate to [0, 255]."""
    np.add(a, 0.5, out=a)
    np.floor(a, out=a)
    np.clip(a, 0, 255, out=a)


def _pixels(a: np.ndarray) -> np.ndarray:
    """``a`` (h, w, c) float64 as (h, w) elements of ``c`` float64s: moved whole, not one by one."""
    return a.view(np.dtype((np.void, 8 * a.shape[2]))).reshape(a.shape[:2])


def downscale_part(
    img: np.ndarray,
    s: int,
    rows: tuple[int, int],
    cols: tuple[int, int],
    method: ResizeMethod = ResizeMethod.MATLAB,
) -> np.ndarray:
    """``downscale(img, s, method)[r0 : r0 + nr, c0 : c0 + nc]`` for ``rows = (r0, nr)``, ``cols = (c0,
    nc)``, bit for bit, computing only those LR pixels (what ``crop_lr`` asks for a band or a patch),
    a few LR rows at a time so that the float64 work arrays stay within ``_SCRATCH_BYTES``.

    At an integer scale each tap of an output away from the border has the same weight and reads
    HR sample ``s * i + k + offset``; with the HR split by phase (``s * q + p`` at ``[p, q]``) a tap pass
    is one multiply of a contiguous view by a scalar and one add, in MATLAB's order (rows first,
    taps in order, float64). The few mirrored outputs at the image border take the gathered path."""
    check_image(img)
    method = ResizeMethod(method)
    h, w = img.shape[:2]
    if s < 1 or h % s or w % s:
        raise ValueError(f"image {w}x{h} is not a multiple of the scale {s}; mod-crop it first")
    if not (0 <= rows[0] and 0 < rows[1] and sum(rows) <= h // s and 0 <= cols[0] and 0 < cols[1] and sum(cols) <= w // s):
        raise ValueError(f"LR rows {rows} x columns {cols} are not in the {w // s}x{h // s} LR")
    if method is ResizeMethod.MATLAB_UINT8 and img.dtype != np.uint8:
        raise ValueError("the matlab-uint8 method takes 8-bit images only")
    c = 1 if img.ndim == 2 else img.shape[2]
    tx = _taps(w, s, *cols)
    chunk = max(1, _SCRATCH_BYTES // (8 * s * (tx.hi - tx.lo) * c) - 4)  # LR rows whose HR rows fit
    out = np.empty((rows[1], cols[1], c), img.dtype)
    for r0 in range(0, rows[1], chunk):
        n = min(chunk, rows[1] - r0)
        out[r0 : r0 + n] = _part(img.reshape(h, w, c), s, _taps(h, s, rows[0] + r0, n), tx, method)
    return out if img.ndim == 3 else out.reshape(rows[1], cols[1])


def _part(img: np.ndarray, s: int, ty: _Taps, tx: _Taps, method: ResizeMethod) -> np.ndarray:
    """The LR rows of ``ty`` x columns of ``tx`` of ``img`` (h, w, c), as (rows, columns, c) of its dtype."""
    c, peak = img.shape[2], float(np.iinfo(img.dtype).max)
    nr, nc = ty.n, tx.n
    integer_path = method is ResizeMethod.MATLAB_UINT8
    # the HR it reads, split by row phase, as float64 (im2double on the double path)
    x = _scratch(0, (s, (ty.hi - ty.lo) // s, (tx.hi - tx.lo) * c))
    np.copyto(x, _by_phase(img[ty.lo : ty.hi, tx.lo : tx.hi].reshape(ty.hi - ty.lo, -1), s))
    if not integer_path:
        np.divide(x, peak, out=x)
    p1 = _scratch(1, (nr, x.shape[2]))
    _tap_pass(x, ty, p1)  # rows first, as MATLAB
    if integer_path:
        _round_u8(p1)
    # then columns: the row pass's output transposed to [column phase, column, row, channel]
    y = _scratch(0, (s, (tx.hi - tx.lo) // s, nr, c))  # x is done with
    np.copyto(_pixels(y.reshape(-1, nr, c)).reshape(s, -1, nr), _by_phase(_pixels(p1.reshape(nr, -1, c)).T, s))
    p2 = _scratch(1, (nc, nr * c))  # p1 is done with
    _tap_pass(y.reshape(s, -1, nr * c), tx, p2)
    if integer_path:
        _round_u8(p2)
    else:  # im2uint8 / im2uint16: clamp to [0, 1], scale, round half up
        np.clip(p2, 0.0, 1.0, out=p2)
        np.multiply(p2, peak, out=p2)
        np.add(p2, 0.5, out=p2)
        np.floor(p2, out=p2)
    out = np.empty((nr, nc, c), img.dtype)
    np.copyto(out, p2.reshape(nc, nr, c).swapaxes(0, 1), casting="unsafe")
    return out
