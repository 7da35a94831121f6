"""Images larger than a region become several region samples: where the regions are, their keys, the
MATLAB-exact LR of each (equal to the crop of the whole image's LR) and the share of a region that
is not flat background (``--min-valid``).

A region's HR starts at a multiple of every scale, so its LR sits on the whole image's LR grid. Its
LR is computed from the region read with a margin of ``3 * s`` HR pixels (the bicubic kernel reaches
``2 * s + 1`` pixels at ``1/s``) clipped to the mod-cropped image, so every LR pixel sees the pixels
(and, at the image's own border, the mirroring) it sees in the whole image: the LR is bit-exact. The
same holds for any band of rows, so the LR is made band by band, in bounded memory.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from shardmaker.imaging.croplr import BAND_PIXELS, crop_lr
from shardmaker.imaging.resize import ResizeMethod

__all__ = ["BAND_PIXELS", "DEFAULT_REGION", "Region", "plan_regions", "region_count", "region_lr", "valid_share"]

DEFAULT_REGION = 8192  # HR pixels per region side
FLAT_BLOCK = 64  # pixels per side of the blocks valid_share looks at
Reader = Callable[[int, int, int, int], np.ndarray]  # (y, x, h, w) -> pixels


@dataclasses.dataclass(frozen=True)
class Region:
    """``h x w`` HR pixels at ``(y, x)`` of an image."""

    y: int
    x: int
    h: int
    w: int

    def key(self, base: str) -> str:
        """The region sample's key: where it is, in HR pixels (``slide_y0008192_x0016384``)."""
        return f"{base}_y{self.y:07d}_x{self.x:07d}"


def _pieces(n: int, side: int, step: int) -> list[tuple[int, int]]:
    """``(start, length)`` of the pieces one side of ``n`` pixels is cut into (see :func:`plan_regions`)."""
    units, rem = divmod(n, step)
    if units == 0:
        return [(0, n)]
    k = -(-n // side)
    while True:
        sizes = [(units // k + (i < units % k)) * step for i in range(k)]
        sizes[-1] += rem
        if max(sizes) <= side or k >= units:
            break
        k += 1
    starts = [sum(sizes[:i]) for i in range(k)]
    return list(zip(starts, sizes, strict=True))


def _grid(side: int, scales: Sequence[int]) -> tuple[int, int]:
    step = math.lcm(*scales)
    return max(step, side // step * step), step


def plan_regions(height: int, width: int, side: int, scales: Sequence[int]) -> list[Region]:
    """Row-major regions of at most ``side`` HR pixels covering the image, as even as the scales'
    grid allows: a side of ``n`` pixels is cut into ``ceil(n / side)`` pieces whose starts are
    multiples of every scale (so each region's LR sits on the whole image's LR grid) and whose
    lengths differ by at most one grid step; only the last piece holds the pixels past the grid.
    No sliver: every region has an LR at every scale."""
    side, step = _grid(side, scales)
    return [Region(y, x, h, w) for y, h in _pieces(height, side, step) for x, w in _pieces(width, side, step)]


def region_count(height: int, width: int, side: int, scales: Sequence[int]) -> int:
    """How many regions :func:`plan_regions` makes, without making them (one list per side)."""
    side, step = _grid(side, scales)
    return len(_pieces(height, side, step)) * len(_pieces(width, side, step))


def region_lr(
    read: Reader,
    image_hw: tuple[int, int],
    region: Region,
    scale: int,
    method: ResizeMethod = ResizeMethod.MATLAB,
    band_pixels: int = BAND_PIXELS,
) -> np.ndarray:
    """The x``scale`` LR of ``region``: the crop of ``downscale(mod_crop(image))`` it covers, computed
    from the region and a margin read through ``read`` (never the whole image), in bands of about
    ``band_pixels`` HR pixels (:func:`shardmaker.imaging.croplr.crop_lr`)."""
    return crop_lr(read, image_hw, (region.y, region.x, region.h, region.w), scale, method, band_pixels)


def valid_share(img: np.ndarray, tolerance: int | None = None) -> float:
    """The share of ``FLAT_BLOCK``-pixel blocks that are not flat: a block is flat when every
    channel's range in it is at most ``tolerance`` (default 8 levels of 8-bit, 2048 of 16-bit).
    Glass background in a slide and nodata in a scene are flat; tissue and terrain are not."""
    tol = (8 if img.dtype == np.uint8 else 2048) if tolerance is None else tolerance
    a = img if img.ndim == 3 else img[:, :, None]
    n = -(-a.shape[0] // FLAT_BLOCK)
    hi = np.empty((n, *a.shape[1:]), a.dtype)
    lo = np.empty_like(hi)
    for i in range(n):  # one band of rows at a time: a contiguous max/min, ~40x numpy's reduceat over rows
        band = a[i * FLAT_BLOCK : (i + 1) * FLAT_BLOCK]
        band.max(axis=0, out=hi[i])
        band.min(axis=0, out=lo[i])
    cols = np.arange(0, a.shape[1], FLAT_BLOCK)
    spread = (np.maximum.reduceat(hi, cols, axis=1).astype(np.int64) - np.minimum.reduceat(lo, cols, axis=1)).max(axis=2)
    return float(np.mean(spread > tol))
