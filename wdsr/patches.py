"""Aligned random patches: LR top-left (y, x) uniform, HR at (s*y, s*x), same dihedral transform.

Each patch's coordinates and transform come from a generator seeded by (seed, epoch, key, j), so
they do not depend on world size, worker count or reading order.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from shardmaker import _compat
from wdsr.augment import N_DIHEDRAL, dihedral_view, to_chw
from wdsr.decode import DecodedPair
from wdsr.errors import SampleError


@dataclasses.dataclass
class Patch:
    lr: np.ndarray  # C x p x p, contiguous copy
    hr: np.ndarray  # C x sp x sp
    key: str
    j: int


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
        if self.patch_size < self.scale or self.patch_size % self.scale:
            raise ValueError(
                f"patch_size {self.patch_size} must be a positive multiple of scale {self.scale} "
                f"(e.g. {max(1, round(self.patch_size / self.scale)) * self.scale})"
            )
        if self.max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {self.max_tries}")


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def patch_rng(seed: int, epoch: int, key: str | int, j: int) -> np.random.Generator:
    """The generator of patch ``j`` of ``key`` (a key or its ``key_hash``) in this epoch."""
    return np.random.default_rng([seed, epoch, key if isinstance(key, int) else key_hash(key), j])


def cut(pair: DecodedPair, spec: PatchConfig, rng: np.random.Generator, j: int) -> tuple[Patch, int]:
    """One patch (and how many candidates were rejected as flat)."""
    s, p = spec.scale, spec.patch_size // spec.scale
    lh, lw = pair.lr.shape[:2]
    if lh < p or lw < p:
        raise SampleError(pair.shard, pair.key, f"LR {lw}x{lh} is smaller than the LR patch {p}x{p}")
    rejected = 0
    best: tuple[float, int, int] | None = None
    for _ in range(spec.max_tries):
        y, x = int(rng.integers(0, lh - p + 1)), int(rng.integers(0, lw - p + 1))
        if spec.min_patch_std is None:
            best = (0.0, y, x)
            break
        std = float(pair.lr[y : y + p, x : x + p].std())
        if best is None or std > best[0]:
            best = (std, y, x)
        if std >= spec.min_patch_std:
            break
        rejected += 1
    assert best is not None
    _, y, x = best
    t = int(rng.integers(0, N_DIHEDRAL)) if spec.augment else 0
    lr = dihedral_view(pair.lr[y : y + p, x : x + p], t)
    hr = dihedral_view(pair.hr[s * y : s * (y + p), s * x : s * (x + p)], t)
    return Patch(to_chw(lr), to_chw(hr), pair.key, j), rejected


def cut_patches(pair: DecodedPair, spec: PatchConfig, seed: int, epoch: int, first: int, count: int) -> tuple[list[Patch], int]:
    """Patches ``first .. first+count-1`` of this pair (j is offset by the plan's wrap count)."""
    out, rejected = [], 0
    kh = key_hash(pair.key)
    for j in range(first, first + count):
        patch, r = cut(pair, spec, patch_rng(seed, epoch, kh, j), j)
        out.append(patch)
        rejected += r
    return out, rejected


__getattr__ = _compat.module_getattr(__name__, {"PatchSpec": ("wdsr.patches.PatchConfig", PatchConfig)})
