"""HR patches for degradations made on the device (``SRDataset(url, degrade=wdsr.RealESRGANConfig())``).

The workers decode HR alone (a dataset's stored LR is not read; HR-only datasets work), cut each
sample's k HR patches at the positions the stored LR would give them (the same draws on the same LR
grid), and draw every patch's degradation parameters (its blur kernels built there) from a generator
of its own, ``seeds.degrade(patch_base(seed, epoch, key), j)``: a patch's parameters depend on the
seed, the epoch, its sample and ``j`` alone, never on the worker, the world or where a pass resumed.
A batch is ``(hr, params)`` (``(hr, params, keys)`` with ``return_keys``): ``hr`` uint8 ``[B, 3, P, P]``,
``params`` one tensor per key with a row per patch; ``wdsr.Degrader(cfg)(batch)`` makes ``(lr, hr)``.

Between the workers and the loader the parameters travel as numpy arrays in a :class:`ParamRows`
(pickled with the batch's slot number: no shared-memory segment per tensor); the loader hands out tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from shardmaker.format import Manifest
from wdsr import seeds
from wdsr.degrade import draw_arrays
from wdsr.errors import SampleError
from wdsr.pipeline.augment import N_DIHEDRAL, chw_shape, patch_source, write_chw
from wdsr.pipeline.patches import Patch, PatchConfig, best_try, draws
from wdsr.pipeline.read import RawSample
from wdsr.pipeline.sample import DecodeSpec, Hr, LrMode, LrSource, tile_reads


class HRPatch(Patch):
    """An HR patch and its degradation parameters (numpy arrays); its LR is made on the device."""

    __slots__ = ("params",)

    def __init__(self, hr: np.ndarray, t: int, key: str, j: int, params: dict[str, np.ndarray]) -> None:
        super().__init__(hr[:0, :0], hr, t, False, key, j)
        self.params = params

    @property
    def lr_shape(self) -> tuple[int, int, int]:
        return (chw_shape(self._hr, self.t, False)[0], 0, 0)

    def write(self, lr_out: np.ndarray, hr_out: np.ndarray) -> None:
        hr = self._hr
        if hr.size != hr_out.size or hr.dtype != hr_out.dtype:
            raise ValueError(f"patches of one batch differ: {self.hr_shape} {hr.dtype} after {hr_out.shape} {hr_out.dtype}")
        write_chw(hr, self.t, False, hr_out)

    @property
    def lr(self) -> np.ndarray:
        return np.empty(self.lr_shape, dtype=self.dtype)


@dataclasses.dataclass(frozen=True)
class ParamRows:
    """A batch's degradation parameters as numpy arrays (a dataclass: the DataLoader passes it untouched)."""

    arrays: dict[str, np.ndarray]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(v) for k, v in self.arrays.items()}


def param_rows(patches: Sequence[Patch]) -> ParamRows | None:
    """The parameters of a batch of :class:`HRPatch` stacked per key (None for other patches)."""
    first = patches[0]
    if not isinstance(first, HRPatch):
        return None
    rows = [p.params for p in patches]  # type: ignore[attr-defined]
    return ParamRows({k: np.stack([r[k] for r in rows]) for k in first.params})


def as_batch(item: Any) -> Any:
    """A batch as the user gets it: a :class:`ParamRows` in it becomes a dict of tensors."""
    if isinstance(item, (tuple, list)) and len(item) >= 2 and isinstance(item[1], ParamRows):  # a list: DataLoader's
        return (item[0], item[1].tensors(), *item[2:])
    return item


class DegradePair:
    """A decoded HR image (an array, or a lazily decoded tiled image) whose patches are cut without
    LR and carry their degradation parameters; ``lr_hw`` is the LR grid their positions are drawn on."""

    chw = False

    def __init__(self, shard: str, key: str, rep: int, hr: Any, scale: int, cfg: Any, decode_ns: int, verify_ns: int):
        self.shard, self.key, self.rep, self.hr, self.scale, self.cfg = shard, key, rep, hr, scale, cfg
        self.decode_ns, self.verify_ns = decode_ns, verify_ns
        h, w = hr.shape[:2]
        channels = hr.shape[2] if len(hr.shape) == 3 else 1
        if hr.dtype != np.uint8 or channels != 3:
            raise SampleError(shard, key, f"degrade= takes 8-bit RGB images; this HR is {hr.dtype} with {channels} channel(s)")
        self.image_hw = (h, w)
        self.lr_hw = (h // scale, w // scale)
        self.tiled = not isinstance(hr, np.ndarray)

    @property
    def lazy(self) -> bool:
        return self.tiled

    def keep(self, cache: Any, channels: int | None, bit_depth: int | None) -> bool:
        return False  # HR alone: the decoded cache keeps pairs

    def take_stats(self) -> dict[str, int]:
        return tile_reads((self.hr,)) if self.tiled else {}

    def hwc(self) -> tuple[np.ndarray, np.ndarray]:
        raise SampleError(self.shard, self.key, "a degrade= sample has no LR to hand out whole (degrade= is for training)")

    def cut(self, spec: PatchConfig, base: np.uint64, first: int, count: int) -> tuple[list[Patch], int]:
        """Patches ``first ..`` at the stored-LR positions (flat patches rejected by their HR's std),
        each with the parameters :func:`wdsr.degrade.draw_arrays` draws for it."""
        s, p = spec.scale, spec.patch_size // spec.scale
        lh, lw = self.lr_hw
        if lh < p or lw < p:
            raise SampleError(self.shard, self.key, f"LR {lw}x{lh} is smaller than the LR patch {p}x{p}")
        bounds = (lh - p + 1, lw - p + 1, N_DIHEDRAL if spec.augment else 1)
        js = np.arange(first, first + count)
        firsts = draws(base, js, 0, bounds)
        if self.tiled:  # a remote tiled image fetches the tiles of every first try at once
            self.hr.prefetch([(s * y, s * x, s * p, s * p) for y, x, _ in firsts.tolist()])
        out: list[Patch] = []
        rejected = 0

        def hr_std(y: int, x: int) -> tuple[float, np.ndarray]:  # the HR patch decides: there is no LR yet
            hr = np.asarray(self.hr[s * y : s * (y + p), s * x : s * (x + p)])
            return float(hr.std()), hr

        for n, j in enumerate(js.tolist()):
            y, x, hr, r = best_try(spec, base, j, firsts[n], bounds, hr_std)
            rejected += r
            t = int(firsts[n][2])
            if hr is None:
                hr = np.asarray(self.hr[s * y : s * (y + p), s * x : s * (x + p)])
            params = draw_arrays(self.cfg, seeds.degrade(base, j), spec.patch_size)
            out.append(HRPatch(patch_source(hr, t), t, self.key, j, params))
        return out, rejected


def degrade_pair(raw: RawSample, hr: Hr, spec: DecodeSpec) -> DegradePair:
    return DegradePair(raw.shard, raw.key, raw.rep, hr.image, spec.scale, spec.degrade, hr.decode_ns, hr.verify_ns)


def check_degrade_input(folder: str, m: Manifest, scale: int) -> None:
    """What the manifest says of a dataset's images, against what a Degrader takes (8-bit RGB)."""
    if m.channels is not None and m.channels != 3:
        raise ValueError(f"{folder}: degrade= takes RGB images; this dataset's have {m.channels} channel(s)")
    if m.bit_depth is not None and m.bit_depth != 8:
        raise ValueError(f"{folder}: degrade= takes 8-bit images; this dataset's are {m.bit_depth}-bit")


SOURCE = LrSource(modes=(LrMode.DEGRADE,), make=degrade_pair, check=check_degrade_input, cacheable=False)
