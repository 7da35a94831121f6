"""Aligned random patches: LR top-left (y, x) uniform, HR at (s*y, s*x), same dihedral transform.

Each patch's coordinates and transform are a hash of (seed, epoch, key, j) (``draws``), so they
do not depend on world size, worker count or reading order, and any patch is computed directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shardmaker import compat
from wdsr import seeds
from wdsr.bounds import check_multiple
from wdsr.errors import SampleError
from wdsr.pipeline import tiled
from wdsr.pipeline.augment import N_DIHEDRAL, chw_shape, patch_source, write_chw
from wdsr.pipeline.decode import DecodedPair
from wdsr.seeds import patch_base as draw_base  # the stream of one sample's patches in one epoch


class Patch:
    """One aligned patch between its cut and its batch: the HR and LR sources it will be written
    from (``augment.patch_source``: views of a decoded-cache pair, or crops copied out of a decoded
    image) and its transform. ``write`` lays it out C x H x W straight into a batch's rows, the
    one copy a patch costs after its crop; ``lr`` and ``hr`` make that copy on their own."""

    __slots__ = ("_lr", "_hr", "t", "planar", "key", "j")

    def __init__(self, lr: np.ndarray, hr: np.ndarray, t: int, planar: bool, key: str, j: int) -> None:
        self._lr, self._hr, self.t, self.planar, self.key, self.j = lr, hr, t, planar, key, j

    @property
    def dtype(self) -> np.dtype:
        return self._hr.dtype

    @property
    def lr_shape(self) -> tuple[int, int, int]:
        return chw_shape(self._lr, self.t, self.planar)

    @property
    def hr_shape(self) -> tuple[int, int, int]:
        return chw_shape(self._hr, self.t, self.planar)

    def write(self, lr_out: np.ndarray, hr_out: np.ndarray) -> None:
        """The patch, C x H x W, into ``lr_out`` and ``hr_out`` (rows of a batch); a patch of
        another size or depth than the rows (a mix of datasets that differ) is refused."""
        lr, hr = self._lr, self._hr
        if lr.size != lr_out.size or hr.size != hr_out.size or hr.dtype != hr_out.dtype:
            raise ValueError(
                f"patches of one batch differ: {self.lr_shape}/{self.hr_shape} {hr.dtype} after "
                f"{lr_out.shape}/{hr_out.shape} {hr_out.dtype} (datasets of a mix must have the same channels and bit depth)"
            )
        write_chw(lr, self.t, self.planar, lr_out)
        write_chw(hr, self.t, self.planar, hr_out)

    @property
    def lr(self) -> np.ndarray:  # C x p x p, a new contiguous array
        out = np.empty(self.lr_shape, dtype=self.dtype)
        write_chw(self._lr, self.t, self.planar, out)
        return out

    @property
    def hr(self) -> np.ndarray:  # C x sp x sp
        out = np.empty(self.hr_shape, dtype=self.dtype)
        write_chw(self._hr, self.t, self.planar, out)
        return out


@dataclasses.dataclass(frozen=True)
class PatchConfig:
    scale: int
    patch_size: int  # HR side; a multiple of scale
    augment: bool = True
    min_patch_std: float | None = None  # reject flatter HR patches (e.g. black endoscope borders)
    max_tries: int = 10

    def __post_init__(self) -> None:
        if self.scale < 1:
            raise ValueError(f"scale must be >= 1, got {self.scale}")
        check_multiple(self.patch_size, self.scale)
        if self.max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {self.max_tries}")


# Patch draws are a counter-based hash (splitmix64's finaliser) of (seed, epoch, key, j, try, field):
# any patch's coordinates are computed directly, for a whole run of patches in a few numpy calls.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)
_FIELDS = 4  # y, x, transform, (spare) per try
_TRIES = 64  # counters per patch: _FIELDS x up to 16 tries (more tries reuse the last ones' slots)


def _mix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def too_small(shards: Sequence[Any], scale: int, patch_size: int) -> tuple[int, int, str | None, tuple[int, int]]:
    """From the manifest's HR sizes alone: how many samples of ``shards`` have an LR smaller than
    the LR patch, out of how many, and the first of them (key, LR ``(w, h)``)."""
    p = patch_size // scale
    whole = getattr(shards, "hr_sizes", None)  # a column index's table: one pass over the mapped column
    if whole is not None:
        hr = np.asarray(whole())  # LR side hr // s < p exactly when hr < p * s: no widening copy of the column
        small = np.flatnonzero(np.minimum(hr[:, 0], hr[:, 1]) < p * scale)
        if not len(small):
            return 0, len(hr), None, (0, 0)
        at = int(small[0])
        ends = np.cumsum(shards.samples_per_shard())  # type: ignore[attr-defined]
        i = int(np.searchsorted(ends, at, side="right"))
        first_key = shards[i].keys[at - (int(ends[i - 1]) if i else 0)]
        return len(small), len(hr), first_key, (int(hr[at, 0]) // scale, int(hr[at, 1]) // scale)
    bad, total, first, first_lr = 0, 0, None, (0, 0)
    for sh in shards:
        hw = np.asarray(sh.hr_sizes, dtype=np.int64).reshape(-1, 2) // scale  # LR (w, h), the mod-crop dropped
        small = np.flatnonzero((hw < p).any(axis=1))
        total += len(hw)
        if len(small) and first is None:
            first, first_lr = sh.keys[int(small[0])], (int(hw[small[0], 0]), int(hw[small[0], 1]))
        bad += len(small)
    return bad, total, first, first_lr


def draws(base: np.uint64, js: np.ndarray, tr: int, bounds: tuple[int, int, int]) -> np.ndarray:
    """``[len(js), 3]`` draws (y, x, transform) of try ``tr`` of patches ``js``, each uniform in
    ``[0, bound)``: the high 32 bits of a 64-bit hash times the bound (bounds are < 2^32)."""
    counters = js.astype(np.uint64)[:, None] * np.uint64(_TRIES) + np.uint64((tr % 16) * _FIELDS) + np.arange(3, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = _mix(base + counters * _GOLDEN)
    return ((h >> _S32) * np.array(bounds, dtype=np.uint64)) >> _S32


def best_try(
    spec: PatchConfig, base: np.uint64, j: int, first: Any, bounds: tuple[int, int, int], measure: Callable[[int, int], Any]
) -> tuple[int, int, Any, int]:
    """Where patch ``j`` goes: its try-0 draw ``first`` (y, x, ...); with ``min_patch_std``, the first of
    up to ``max_tries`` draws whose ``measure(y, x) -> (std, made)`` reaches it, else the least flat.
    Returns ``(y, x, made, rejected)``; ``made`` is what the chosen try's measure made (None untried)."""
    y, x = int(first[0]), int(first[1])
    if spec.min_patch_std is None:
        return y, x, None, 0
    best: tuple[float, int, int, Any] | None = None
    rejected = 0
    for tr in range(spec.max_tries):
        if tr:
            y, x = (int(v) for v in draws(base, np.array([j]), tr, bounds)[0][:2])
        std, made = measure(y, x)
        if best is None or std > best[0]:
            best = (std, y, x, made)
        if std >= spec.min_patch_std:
            break
        rejected += 1
    assert best is not None
    return best[1], best[2], best[3], rejected


def cut(pair: DecodedPair, spec: PatchConfig, base: np.uint64, j: int, first: np.ndarray | None = None) -> tuple[Patch, int]:
    """Patch ``j`` (and how many candidates were rejected as flat); ``first``: its try-0 draws."""
    s, p = spec.scale, spec.patch_size // spec.scale
    lh, lw = pair.lr_hw
    if lh < p or lw < p:
        raise SampleError(pair.shard, pair.key, f"LR {lw}x{lh} is smaller than the LR patch {p}x{p}")
    bounds = (lh - p + 1, lw - p + 1, N_DIHEDRAL if spec.augment else 1)
    d = first if first is not None else draws(base, np.array([j]), 0, bounds)[0]
    t = int(d[2])

    def lr_std(cy: int, cx: int) -> tuple[float, None]:
        return float((pair.lr[:, cy : cy + p, cx : cx + p] if pair.chw else pair.lr[cy : cy + p, cx : cx + p]).std()), None

    y, x, _, rejected = best_try(spec, base, j, d, bounds, lr_std)
    if pair.chw:  # planar arrays (the decoded cache)
        lr_v, hr_v = pair.lr[:, y : y + p, x : x + p], pair.hr[:, s * y : s * (y + p), s * x : s * (x + p)]
    else:
        lr_v, hr_v = pair.lr[y : y + p, x : x + p], pair.hr[s * y : s * (y + p), s * x : s * (x + p)]
    return Patch(patch_source(lr_v, t, pair.chw), patch_source(hr_v, t, pair.chw), t, pair.chw, pair.key, j), rejected


def cut_patches(pair: DecodedPair, spec: PatchConfig, seed: int, epoch: int, first: int, count: int) -> tuple[list[Patch], int]:
    """Patches ``first .. first+count-1`` of this pair (j is offset by the plan's wrap count)."""
    own = getattr(pair, "cut_own", None)  # a clip segment's windows (pipeline.clips), LR made per patch (pipeline.bicubic)
    if own is not None:
        return own(spec, draw_base(seed, epoch, pair.key), first, count)  # type: ignore[no-any-return]
    out, rejected = [], 0
    base = draw_base(seed, epoch, pair.key)
    p = spec.patch_size // spec.scale
    lh, lw = pair.lr_hw
    js = np.arange(first, first + count)
    firsts = draws(base, js, 0, (max(1, lh - p + 1), max(1, lw - p + 1), N_DIHEDRAL if spec.augment else 1))
    if pair.tiled:  # a remote tiled pair fetches the tiles of all these patches at once (their first tries)
        tiled.prefetch_patches(pair, [(y, x) for y, x, _ in firsts.tolist()], p, spec.scale)
    if spec.min_patch_std is not None or lh < p or lw < p:
        for n, j in enumerate(range(first, first + count)):
            patch, r = cut(pair, spec, base, j, firsts[n])
            out.append(patch)
            rejected += r
        return out, rejected
    # every patch its try-0 draw: what cut() does, without its per-patch checks
    s, lr, hr, chw, key = spec.scale, pair.lr, pair.hr, pair.chw, pair.key
    for j, (y, x, t) in zip(range(first, first + count), firsts.tolist(), strict=True):
        if chw:
            lr_v, hr_v = lr[:, y : y + p, x : x + p], hr[:, s * y : s * (y + p), s * x : s * (x + p)]
        else:
            lr_v, hr_v = lr[y : y + p, x : x + p], hr[s * y : s * (y + p), s * x : s * (x + p)]
        out.append(Patch(patch_source(lr_v, t, chw), patch_source(hr_v, t, chw), t, chw, key, j))
    return out, 0


__getattr__ = compat.module_getattr(
    __name__,
    {"PatchSpec": ("wdsr.pipeline.patches.PatchConfig", PatchConfig), "key_hash": ("wdsr.seeds.key_hash", seeds.key_hash)},
)
