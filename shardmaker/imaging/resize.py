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
The LR of part of an image (a patch, a band, a region) is ``shardmaker.imaging.croplr``'s.
"""

from __future__ import annotations

import enum
import math

import numpy as np

__all__ = ["ResizeMethod", "imresize", "downscale", "upscale", "contributions", "check_image", "BLOCK_BYTES"]

_KERNEL_WIDTH = 4.0
# Output rows per block: keeps the float64 accumulator of one block within L2 cache.
BLOCK_BYTES = 1 << 19


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
    block = max(1, BLOCK_BYTES // (8 * max(cols, 1)))
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


def check_image(img: np.ndarray) -> None:
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
    check_image(img)
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
