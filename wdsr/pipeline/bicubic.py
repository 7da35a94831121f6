"""LR made per patch (``SRDataset(url, scale=s, lr="bicubic")``): each LR patch is computed from its HR
patch and a margin, MATLAB-exactly, so it is byte for byte the crop of the whole image's MATLAB LR
(``downscale(mod_crop(hr), s)``; ``lr="bicubic-uint8"``: ``--lr-method matlab-uint8``'s).

The patch positions are the stored-LR ones (the same draws on the same LR grid, ``floor(H / s) x
floor(W / s)``), so a dataset streamed with ``lr="bicubic"`` gives the batches it gives with its stored
MATLAB LR, and any integer scale works from one dataset, HR-only ones (``shardmaker build --hr-only``)
included. The margin is ``3 * s`` HR pixels clipped to the mod-cropped image, where the kernel's
mirroring happens as it does for the whole image (``shardmaker.imaging.croplr.crop_lr``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shardmaker.format import Manifest
from shardmaker.imaging import ResizeMethod, crop_lr
from wdsr.errors import SampleError
from wdsr.pipeline.augment import N_DIHEDRAL, patch_source
from wdsr.pipeline.patches import Patch, PatchConfig, best_try, draws
from wdsr.pipeline.read import RawSample
from wdsr.pipeline.sample import DecodeSpec, Hr, LrMode, LrSource, tile_reads

MODES = {LrMode.BICUBIC: ResizeMethod.MATLAB, LrMode.BICUBIC_UINT8: ResizeMethod.MATLAB_UINT8}


class BicubicPair:
    """A decoded HR image (an array or a lazily decoded tiled image) whose LR patches are made as
    they are cut; ``lr_hw`` is the LR grid the patch positions are drawn on."""

    chw = False

    def __init__(self, shard: str, key: str, rep: int, hr: Any, scale: int, method: ResizeMethod, decode_ns: int, verify_ns: int):
        self.shard, self.key, self.rep, self.hr, self.scale, self.method = shard, key, rep, hr, scale, method
        self.decode_ns, self.verify_ns = decode_ns, verify_ns
        h, w = hr.shape[:2]
        if method is ResizeMethod.MATLAB_UINT8 and hr.dtype != np.uint8:
            raise SampleError(shard, key, "lr='bicubic-uint8' takes 8-bit images only (use lr='bicubic')")
        self.image_hw = (h, w)
        self.lr_hw = (h // scale, w // scale)
        self.tiled = not isinstance(hr, np.ndarray)

    @property
    def lazy(self) -> bool:
        return self.tiled

    def keep(self, cache: Any, channels: int | None, bit_depth: int | None) -> bool:
        return False  # the HR alone: the decoded cache keeps pairs

    def take_stats(self) -> dict[str, int]:
        """The tile reads of a tiled HR (never the whole LR)."""
        return tile_reads((self.hr,)) if self.tiled else {}

    @property
    def lr(self) -> np.ndarray:
        """The whole LR (what ``split="val"`` and ``hwc`` hand out): made from the whole HR."""
        return self.lr_patch(0, 0, self.lr_hw[0], self.lr_hw[1])

    def hwc(self) -> tuple[np.ndarray, np.ndarray]:
        s = self.scale
        hr = np.asarray(self.hr)[: s * self.lr_hw[0], : s * self.lr_hw[1]]
        return hr, self.lr

    def lr_patch(self, y: int, x: int, ph: int, pw: int) -> np.ndarray:
        """LR pixels ``[y, y + ph) x [x, x + pw)``: the crop of the whole image's MATLAB LR."""
        s, hr = self.scale, self.hr

        def read(yy: int, xx: int, hh: int, ww: int) -> np.ndarray:
            return np.asarray(hr[yy : yy + hh, xx : xx + ww])

        return crop_lr(read, self.image_hw, (s * y, s * x, s * ph, s * pw), s, self.method)

    def cut(self, spec: PatchConfig, base: np.uint64, first: int, count: int) -> tuple[list[Patch], int]:
        """Patches ``first ..`` at the positions the stored LR would give them (rejection of flat
        patches included: the LR of each try is made to measure it)."""
        s, p = spec.scale, spec.patch_size // spec.scale
        lh, lw = self.lr_hw
        if lh < p or lw < p:
            raise SampleError(self.shard, self.key, f"LR {lw}x{lh} is smaller than the LR patch {p}x{p}")
        t0 = time.perf_counter_ns()
        bounds = (lh - p + 1, lw - p + 1, N_DIHEDRAL if spec.augment else 1)
        js = np.arange(first, first + count)
        firsts = draws(base, js, 0, bounds)
        if self.tiled:  # a remote tiled HR fetches the tiles of every first try (patch and margin) at once
            m, (ih, iw) = 3 * s, self.image_hw
            boxes = []
            for y, x, _ in firsts.tolist():
                y0, x0 = max(0, s * y - m), max(0, s * x - m)
                boxes.append((y0, x0, min(ih, s * (y + p) + m) - y0, min(iw, s * (x + p) + m) - x0))
            self.hr.prefetch(boxes)
        out, rejected = [], 0

        def lr_std(y: int, x: int) -> tuple[float, np.ndarray]:  # the LR of each try, made to measure it
            lr = self.lr_patch(y, x, p, p)
            return float(lr.std()), lr

        for n, j in enumerate(js.tolist()):
            y, x, lr, r = best_try(spec, base, j, firsts[n], bounds, lr_std)
            rejected += r
            t = int(firsts[n][2])
            if lr is None:
                lr = self.lr_patch(y, x, p, p)
            hr = np.asarray(self.hr[s * y : s * (y + p), s * x : s * (x + p)])
            out.append(Patch(patch_source(lr, t), patch_source(hr, t), t, False, self.key, j))
        self.decode_ns += time.perf_counter_ns() - t0  # making LR is this path's decode of LR
        return out, rejected


def bicubic_pair(raw: RawSample, hr: Hr, spec: DecodeSpec) -> BicubicPair:
    return BicubicPair(raw.shard, raw.key, raw.rep, hr.image, spec.scale, MODES[spec.lr], hr.decode_ns, hr.verify_ns)


def _any_dataset(folder: str, m: Manifest, scale: int) -> None:
    """LR made from HR: any dataset with HR images, at any integer scale."""


SOURCE = LrSource(modes=(LrMode.BICUBIC, LrMode.BICUBIC_UINT8), make=bicubic_pair, check=_any_dataset, cacheable=False)
