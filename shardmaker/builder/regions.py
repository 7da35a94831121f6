"""Images larger than a region become several region samples: where the regions are, their keys, the
MATLAB-exact LR of each (equal to the crop of the whole image's LR) and the share of a region that
is not flat background (``--min-valid``).

A region's HR starts at a multiple of every scale, so its LR sits on the whole image's LR grid. Its
LR is computed from the region read with a margin of ``3 * s`` HR pixels (the bicubic kernel reaches
``2 * s + 1`` pixels at ``1/s``) clipped to the mod-cropped image, so every LR pixel sees the pixels
(and, at the image's own border, the mirroring) it sees in the whole image: the LR is bit-exact.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from shardmaker.imaging.resize import ResizeMethod, downscale

__all__ = ["DEFAULT_REGION", "Region", "plan_regions", "region_lr", "valid_share"]

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


def plan_regions(height: int, width: int, side: int, scales: Sequence[int]) -> list[Region]:
    """Row-major regions of at most ``side`` (rounded down to a multiple of every scale) covering the
    image; a last row or column thinner than the scales' step joins its neighbour, so every region
    has an LR at every scale."""
    step = math.lcm(*scales)
    side = max(step, side // step * step)

    def starts(n: int) -> list[tuple[int, int]]:
        cuts = list(range(0, n, side))
        if len(cuts) > 1 and n - cuts[-1] < step:
            cuts.pop()
        return [(a, (cuts[i + 1] if i + 1 < len(cuts) else n) - a) for i, a in enumerate(cuts)]

    return [Region(y, x, h, w) for y, h in starts(height) for x, w in starts(width)]


def region_lr(
    read: Reader, image_hw: tuple[int, int], region: Region, scale: int, method: ResizeMethod = ResizeMethod.MATLAB
) -> np.ndarray:
    """The x``scale`` LR of ``region``: the crop of ``downscale(mod_crop(image))`` it covers, computed
    from the region and a margin read through ``read`` (never the whole image)."""
    s = scale
    if region.y % s or region.x % s:
        raise ValueError(f"region at ({region.x}, {region.y}) is not on the x{s} grid")
    hc, wc = image_hw[0] // s * s, image_hw[1] // s * s  # the mod-cropped image the LR is made from
    y1, x1 = min(region.y + region.h, hc), min(region.x + region.w, wc)
    if y1 <= region.y or x1 <= region.x:
        raise ValueError(f"region {region} has no x{s} LR in a {image_hw[1]}x{image_hw[0]} image")
    m = 3 * s
    ty, tx = max(0, region.y - m), max(0, region.x - m)
    by, bx = min(hc, y1 + m), min(wc, x1 + m)
    lr = downscale(read(ty, tx, by - ty, bx - tx), s, method)
    oy, ox = (region.y - ty) // s, (region.x - tx) // s
    return np.ascontiguousarray(lr[oy : oy + (y1 - region.y) // s, ox : ox + (x1 - region.x) // s])


def valid_share(img: np.ndarray, tolerance: int | None = None) -> float:
    """The share of ``FLAT_BLOCK``-pixel blocks that are not flat: a block is flat when every
    channel's range in it is at most ``tolerance`` (default 8 levels of 8-bit, 2048 of 16-bit).
    Glass background in a slide and nodata in a scene are flat; tissue and terrain are not."""
    tol = (8 if img.dtype == np.uint8 else 2048) if tolerance is None else tolerance
    a = img if img.ndim == 3 else img[:, :, None]
    rows, cols = np.arange(0, a.shape[0], FLAT_BLOCK), np.arange(0, a.shape[1], FLAT_BLOCK)
    hi = np.maximum.reduceat(np.maximum.reduceat(a, rows, axis=0), cols, axis=1)
    lo = np.minimum.reduceat(np.minimum.reduceat(a, rows, axis=0), cols, axis=1)
    spread = (hi.astype(np.int64) - lo).max(axis=2)
    return float(np.mean(spread > tol))
