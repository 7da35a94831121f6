"""Aligned random patches: LR top-left (y, x) uniform, HR at (s*y, s*x), same dihedral transform.

Each patch's coordinates and transform are a hash of (seed, epoch, key, j) (``draws``), so they
do not depend on world size, worker count or reading order, and any patch is computed directly.
Every kind of decoded sample is a :class:`Pair`, which cuts its own patches at those positions
(``wdsr.pipeline.whole``, ``tiled``, ``clips``, ``bicubic``, ``degraded``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from shardmaker import deprecation
from wdsr import seeds
from wdsr.bounds import check_multiple
from wdsr.pipeline.augment import chw_shape, write_chw
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


class Pair(Protocol):
    """A decoded sample of any kind (``wdsr.pipeline.kinds``): an image pair (whole or tiled), a pair
    whose LR is made per patch or on the device, a clip segment. What the source, the stream and the
    val pass ask of it; ``cut`` is the one thing each kind does its own way."""

    shard: str
    key: str
    rep: int
    decode_ns: int  # decoding (and making LR) so far
    verify_ns: int  # checking digests and headers

    @property
    def lr_hw(self) -> tuple[int, int]: ...  # the LR grid the patch positions are drawn on

    @property
    def lazy(self) -> bool: ...  # decodes as its patches are cut (tiles, frames): a bad part shows at the first cut

    def cut(self, spec: PatchConfig, base: np.uint64, first: int, count: int) -> tuple[list[Any], int]:
        """Patches ``first .. first + count - 1`` (each at the position its draws from ``base`` give it)
        and how many candidates were rejected as flat."""
        ...

    def keep(self, cache: Any, channels: int | None, bit_depth: int | None) -> bool:
        """Keep this pair in the node-wide decoded cache, or use it (a clip's frames); True: stored now."""
        ...

    def hwc(self) -> tuple[np.ndarray, np.ndarray]: ...  # (HR, LR) whole, H x W [x C] (split="val")

    def take_stats(self) -> dict[str, int]: ...  # counts since the last call: tile bytes read, decoded-cache hits


def cut_patches(pair: Pair, spec: PatchConfig, seed: int, epoch: int, first: int, count: int) -> tuple[list[Any], int]:
    """Patches ``first .. first+count-1`` of this pair (j is offset by the plan's wrap count), cut as its kind cuts them."""
    return pair.cut(spec, draw_base(seed, epoch, pair.key), first, count)


__getattr__ = deprecation.module_getattr(
    __name__,
    {"PatchSpec": ("wdsr.pipeline.patches.PatchConfig", PatchConfig), "key_hash": ("wdsr.seeds.key_hash", seeds.key_hash)},
)
