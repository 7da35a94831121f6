"""MATLAB-compatible bicubic ``imresize``, bit-exact, separable and banded.

Written from the published algorithm (Keys cubic, a = -0.5; antialiasing when shrinking;
symmetric borders; one dimension at a time, rows first).  Each output sample is the sum, in tap
order, of ``weight * input`` in float64, exactly as MATLAB's ``imresizemex`` does, so the results
match MATLAB to the last bit:

* ``double`` path: MATLAB on ``im2double`` input, rounded to uint8 once at the end
  (BasicSR's ``generate_bicubic_img.m``).
* ``uint8`` path: MATLAB on uint8 input, which rounds to uint8 after each axis pass
  (how the Set5/Set14/RCAN benchmark LR images were made).

The work is O(out * taps) per axis: no dense matrices, processed in cache-sized row blocks.
"""

from __future__ import annotations

import enum
import functools
import math
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["ResizeMethod", "imresize", "downscale", "contributions"]

_KERNEL_WIDTH = 4.0
# Output rows per block: keeps the float64 accumulator of one block within L2 cache.
_BLOCK_BYTES = 1 << 19


class ResizeMethod(str, enum.Enum):
    """How LR images are computed; the value is what the manifest and CLI call it."""

    MATLAB = "matlab"  # MATLAB imresize on im2double input, rounded once
    MATLAB_UINT8 = "matlab-uint8"  # MATLAB imresize on uint8 input, rounded after each pass


def _cubic(x: np.ndarray) -> np.ndarray:
    """Keys cubic kernel with a = -0.5, written with MATLAB's operation order."""
    absx = np.abs(x)
    absx2 = absx * absx
    absx3 = absx2 * absx
    inner = (1.5 * absx3 - 2.5 * absx2 + 1.0) * (absx <= 1)
    outer = (-0.5 * absx3 + 2.5 * absx2 - 4.0 * absx + 2.0) * ((absx > 1) & (absx <= 2))
    return inner + outer


def contributions(in_len: int, out_len: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-output tap weights and 0-based input indices along one axis, as MATLAB computes them.

    Returns ``(weights, indices)``, both shaped ``(out_len, taps)``; taps whose weight is zero
    for every output are dropped, as MATLAB does.
    """
    if in_len < 1 or out_len < 1:
        raise ValueError(f"cannot resize an axis of length {in_len} to {out_len}")
    kernel_width = _KERNEL_WIDTH
    antialias = scale < 1
    if antialias:
        kernel_width = kernel_width / scale
    x = np.arange(1, out_len + 1, dtype=np.float64)
    u = x / scale + 0.5 * (1 - 1 / scale)
    left = np.floor(u - kernel_width / 2)
    taps = int(math.ceil(kernel_width)) + 2
    indices = left[:, None] + np.arange(taps, dtype=np.float64)[None, :]
    dist = u[:, None] - indices
    weights = scale * _cubic(scale * dist) if antialias else _cubic(dist)
    total = weights[:, 0].copy()
    for k in range(1, taps):  # sequential sum, as MATLAB's sum along a short row
        total = total + weights[:, k]
    weights = weights / total[:, None]
    # Mirror out-of-range indices: aux = [1:n, n:-1:1] (1-based), periodic.
    period = 2 * in_len
    idx = np.mod(indices.astype(np.int64) - 1, period)
    idx = np.where(idx < in_len, idx, period - 1 - idx)
    keep = np.any(weights != 0, axis=0)
    return np.ascontiguousarray(weights[:, keep]), np.ascontiguousarray(idx[:, keep])


def _resize_axis0(
    a: np.ndarray, weights: np.ndarray, idx: np.ndarray, to_uint8: bool, divisor: float | None = None
) -> np.ndarray:
    """Resize along axis 0 of ``a`` (2-D, rows x cols) with the given taps.

    With ``divisor`` set, gathered integer rows are divided by it in float64 first
    (``im2double``), in cache-sized blocks: no float64 copy of the whole image is made.
    """
    out_len, taps = weights.shape
    cols = a.shape[1]
    out = np.empty((out_len, cols), dtype=np.uint8 if to_uint8 else np.float64)
    block = max(1, _BLOCK_BYTES // (8 * max(cols, 1)))
    acc = np.empty((block, cols), dtype=np.float64)
    tmp = np.empty((block, cols), dtype=np.float64)

    def tap(k: int, w: np.ndarray, ix: np.ndarray, dst: np.ndarray) -> None:
        if divisor is None:
            np.multiply(a[ix[:, k]], w[:, k : k + 1], out=dst, casting="unsafe")
        else:
            np.divide(a[ix[:, k]], divisor, out=dst, casting="unsafe")
            np.multiply(dst, w[:, k : k + 1], out=dst)

    for r0 in range(0, out_len, block):
        r1 = min(out_len, r0 + block)
        w, ix = weights[r0:r1], idx[r0:r1]
        acc_v, tmp_v = acc[: r1 - r0], tmp[: r1 - r0]
        tap(0, w, ix, acc_v)
        for k in range(1, taps):
            tap(k, w, ix, tmp_v)
            np.add(acc_v, tmp_v, out=acc_v)
        if to_uint8:
            # imresizemex: round half away from zero, saturate to [0, 255].
            np.add(acc_v, 0.5, out=acc_v)
            np.floor(acc_v, out=acc_v)
            np.clip(acc_v, 0, 255, out=acc_v)
        out[r0:r1] = acc_v
    return out


def _check_image(img: np.ndarray) -> None:
    if img.ndim not in (2, 3):
        raise ValueError(f"expected an HxW or HxWxC image, got shape {img.shape}")
    if img.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"expected a uint8 or uint16 image, got {img.dtype}")


def imresize(
    img: np.ndarray,
    out_hw: tuple[int, int],
    scale: tuple[float, float],
    method: ResizeMethod = ResizeMethod.MATLAB,
) -> np.ndarray:
    """MATLAB ``imresize(img, scale, 'bicubic')`` with an explicit output size.

    ``scale`` is the (rows, cols) factor MATLAB uses (output / input, e.g. ``1/4``); ``out_hw``
    the output size. Returns the same dtype as ``img`` (uint8 or uint16).
    """
    _check_image(img)
    method = ResizeMethod(method)
    peak = float(np.iinfo(img.dtype).max)
    h, w = img.shape[:2]
    c = 1 if img.ndim == 2 else img.shape[2]
    # MATLAB resizes the axis with the smaller scale first; rows first on ties.
    order = (0, 1) if scale[0] <= scale[1] else (1, 0)
    integer_path = method is ResizeMethod.MATLAB_UINT8
    if integer_path and img.dtype != np.uint8:
        raise ValueError("the matlab-uint8 method takes 8-bit images only")
    cur: np.ndarray = img.reshape(h, w, c)
    divisor: float | None = None if integer_path else peak  # im2double, applied per block
    for axis in order:
        n_out = out_hw[axis]
        wts, idx = contributions(cur.shape[axis], n_out, scale[axis])
        moved = np.moveaxis(cur, axis, 0)
        rest = moved.shape[1:]
        flat = np.ascontiguousarray(moved).reshape(moved.shape[0], -1)
        res = _resize_axis0(flat, wts, idx, to_uint8=integer_path, divisor=divisor)
        divisor = None
        cur = np.moveaxis(res.reshape((n_out,) + rest), 0, axis)
    if integer_path:
        out = np.ascontiguousarray(cur)
    else:
        # im2uint8 / im2uint16: clamp to [0, 1], scale, round half up.
        val = np.clip(cur, 0.0, 1.0) * peak + 0.5
        out = np.floor(val).astype(img.dtype)
    return out.reshape(out_hw) if img.ndim == 2 else out


def downscale(img: np.ndarray, factor: int, method: ResizeMethod = ResizeMethod.MATLAB) -> np.ndarray:
    """Integer downscale by ``factor`` as ``imresize(img, 1/factor, 'bicubic')``.

    ``img`` sides must be multiples of ``factor`` (mod-crop first); the output is exactly
    ``(h/factor, w/factor)``.
    """
    h, w = img.shape[:2]
    if factor < 1 or h % factor or w % factor:
        raise ValueError(f"image {w}x{h} is not a multiple of the scale {factor}; mod-crop it first")
    return imresize(img, (h // factor, w // factor), (1 / factor, 1 / factor), method)


def upscale(img: np.ndarray, factor: int, method: ResizeMethod = ResizeMethod.MATLAB) -> np.ndarray:
    """Integer upscale as ``imresize(img, factor, 'bicubic')`` (used for bicubic baselines)."""
    h, w = img.shape[:2]
    return imresize(img, (h * factor, w * factor), (float(factor), float(factor)), method)


# ---- the LR of part of an image ---------------------------------------------------------------
BAND_PIXELS = 1 << 22  # HR pixels per band of crop_lr: its float64 passes then hold ~100 MB for RGB


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
    ``band_pixels`` HR pixels, so the resize's float64 passes hold one band, not the box. The box
    starts on the x``scale`` grid. Used for region samples (``shardmaker build --region``) and for LR
    made per patch (``SRDataset(lr="bicubic")``)."""
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


# ---- part of the LR of an image, fast: strided tap passes ----------------------------------------
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
    ramp = np.arange(w.shape[1])
    mid = out_len // 2  # an output away from both borders, if the axis has one
    off = int(ix_all[mid, 0]) - s * mid  # there, tap k of output i reads s * i + off + k
    ok = np.all(w == w_all[mid], axis=1) & np.all(ix == off + s * np.arange(o0, o0 + n)[:, None] + ramp, axis=1)
    if not np.array_equal(ix_all[mid], ix_all[mid, 0] + ramp):
        ok[:] = False
    good = np.flatnonzero(ok)
    first, last = (int(good[0]), int(good[-1]) + 1) if good.size else (0, 0)
    lo, hi = int(ix.min()) // s * s, -(-(int(ix.max()) + 1) // s) * s
    at = [off + s * (o0 + first) + k - lo for k in ramp.tolist()]  # tap k of output `first`, from lo
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
    block = max(1, _BLOCK_BYTES // (8 * cols))
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
    _check_image(img)
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
