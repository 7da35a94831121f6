"""``SRDataset``: the streaming IterableDataset (plan -> read -> decode -> patch -> shuffle -> batch)."""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import IterableDataset

from shardmaker import _compat
from shardmaker.errors import OnError
from shardmaker.format import headers
from shardmaker.format import manifest as mf
from wdsr import env
from wdsr.decode import DecodedPair, Verify, decode_pair, wanted_members
from wdsr.errors import SampleError
from wdsr.handoff import BatchPool
from wdsr.patches import Patch, PatchConfig, cut_patches
from wdsr.plan import Span, slice_length, train_plan, val_plan
from wdsr.read import Fetch, ReadConfig, ShardReader
from wdsr.remote import Retry
from wdsr.shuffle import shuffled
from wdsr.stats import SharedStats
from wdsr.tiles import tile_boxes

log = logging.getLogger("wdsr")
_EXTRA_J = 1 << 32  # patch indices for patches that stand in for skipped samples


class Split(str, enum.Enum):
    TRAIN = "train"
    VAL = "val"


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
    scale: int = 4
    patch_size: int = 192
    patches_per_image: int = 16
    batch_size: int = 16
    shuffle_buffer: int = 1024
    augment: bool = True
    seed: int = 0
    split: Split = Split.TRAIN
    on_error: OnError = OnError.FAIL
    min_patch_std: float | None = None
    max_tries: int = 10
    verify: Verify = Verify.XXH3
    tile: int | None = None  # val: LR tile side; None = whole images
    tile_overlap: int = 8
    return_keys: bool = False
    max_pixels: int = headers.DEFAULT_MAX_PIXELS  # HR pixels; checked from the header, before decoding

    def __post_init__(self) -> None:
        object.__setattr__(self, "split", Split(self.split))
        object.__setattr__(self, "on_error", OnError(self.on_error))
        object.__setattr__(self, "verify", Verify(self.verify))
        if self.patches_per_image < 1 or self.batch_size < 1:
            raise ValueError("patches_per_image and batch_size must be >= 1")
        if self.tile is not None and not 0 <= self.tile_overlap < self.tile:
            raise ValueError(f"tile_overlap must be in [0, tile), got {self.tile_overlap} for tile {self.tile}")
        if self.split is Split.TRAIN:
            PatchConfig(self.scale, self.patch_size, self.augment, self.min_patch_std, self.max_tries)


class ValSample(NamedTuple):
    """A whole image (``boxes`` None) or all its tiles; LR-pixel boxes ``(y, x, h, w)`` to stitch."""

    lr: torch.Tensor  # [1 or T, C, h, w]
    hr: torch.Tensor  # [1 or T, C, s*h, s*w]
    key: str
    boxes: list[tuple[int, int, int, int]] | None
    lr_size: tuple[int, int]  # (w, h) of the whole LR image, like every size in wdsr and the manifest


class SRDataset(IterableDataset):
    """Stream aligned (LR, HR) patch batches from a ``wdsr-shards/1`` dataset.

    Train: every rank gets the same number of batches; batches are uint8 (or uint16) tensors
    ``lr [B,C,p,p]``, ``hr [B,C,s*p,s*p]`` made in the workers. Val: every image once across
    ranks, in manifest order, whole or tiled. Use :func:`wdsr.make_loader` to build the loader.

    Remote URLs (``s3://...``; credentials, region and endpoint from the standard AWS variables
    or ``storage_options``) are read with range requests that ``retry`` and resume at the byte
    reached; ``read_ahead`` samples are fetched while one is decoded; ``cache_dir`` keeps whole
    shards on local disk (``cache_limit`` bytes, least recently used evicted) for later epochs.
    """

    def __init__(
        self,
        url: str,
        scale: int = 4,
        patch_size: int = 192,
        patches_per_image: int = 16,
        batch_size: int = 16,
        shuffle_buffer: int = 1024,
        augment: bool = True,
        seed: int = 0,
        split: str = "train",
        on_error: str = "fail",
        min_patch_std: float | None = None,
        max_tries: int = 10,
        verify: str = "xxh3_64",
        tile: int | None = None,
        tile_overlap: int = 8,
        return_keys: bool = False,
        storage_options: dict[str, Any] | None = None,
        world: env.World | None = None,
        retry: Retry | None = None,
        read_ahead: int = 1,
        cache_dir: str | None = None,
        cache_limit: int | None = None,
        fetch: str = "ranges",
        max_pixels: int = headers.DEFAULT_MAX_PIXELS,
    ) -> None:
        super().__init__()
        self.opts = DatasetConfig(
            scale,
            patch_size,
            patches_per_image,
            batch_size,
            shuffle_buffer,
            augment,
            seed,
            Split(split),
            OnError(on_error),
            min_patch_std,
            max_tries,
            Verify(verify),
            tile,
            tile_overlap,
            return_keys,
            max_pixels,
        )
        self.url = url
        self.manifest = mf.load(url, storage_options)
        if scale not in self.manifest.scales:
            raise ValueError(f"{url}: no x{scale} LR in this dataset (scales: {self.manifest.scales})")
        self.world = world if world is not None else env.current_world()
        self.reader = ShardReader(
            url, self.manifest, storage_options, ReadConfig(retry or Retry(), read_ahead, Fetch(fetch), cache_dir, cache_limit)
        )
        self.num_workers = 0  # set by make_loader, used by __len__
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()  # shared with (persistent) workers
        self.epoch_set = False
        self.stats = SharedStats()
        self.handoff: BatchPool | None = None  # set by make_loader when there are workers
        self._logged: set[tuple[str, str | None]] = set()

    def __repr__(self) -> str:
        o = self.opts
        return (
            f"SRDataset({self.url!r}, split={o.split.value}, scale={o.scale}, patch_size={o.patch_size}, "
            f"patches_per_image={o.patches_per_image}, batch_size={o.batch_size}, samples={self.manifest.samples}, "
            f"rank={self.world.rank}/{self.world.size})"
        )

    # ---- epochs and sizes -------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (shard order, patch positions); reaches persistent workers too."""
        self._epoch[0] = int(epoch)
        self.epoch_set = True

    def _sizes(self) -> list[int]:
        return [s.samples for s in self.manifest.shards]

    def samples_per_worker(self, num_workers: int | None = None) -> int:
        nw = max(1, self.num_workers if num_workers is None else num_workers)
        return slice_length(self.manifest.samples, self.world.size * nw)

    def batches_per_worker(self, num_workers: int | None = None) -> int:
        return self.samples_per_worker(num_workers) * self.opts.patches_per_image // self.opts.batch_size

    def __len__(self) -> int:
        """Train: batches per rank per epoch (exact). Val: images (items) of this rank."""
        return self.length(self.num_workers)

    def length(self, num_workers: int) -> int:
        """``len()`` for a loader with ``num_workers`` workers."""
        nw = max(1, num_workers)
        if self.opts.split is Split.VAL:
            return sum(len(s) for s in val_plan(self._sizes(), self.world.size, nw)[self.world.rank * nw :][:nw])
        return nw * self.batches_per_worker(nw)

    # ---- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        worker, nw = env.current_worker()
        if self.opts.split is Split.VAL:
            return self._val(worker, nw)
        return self._train(worker, nw)

    def _skip(self, worker: int, err: SampleError, samples: int = 1) -> None:
        if self.opts.on_error is OnError.FAIL:
            raise err
        self.stats.add(worker, skipped=samples)
        if (err.shard, err.key) not in self._logged:
            self._logged.add((err.shard, err.key))
            log.warning("skipping %s (%d sample(s))", err, samples)

    def _pairs(self, spans: list[Span], worker: int) -> Iterator[DecodedPair | SampleError]:
        """Decoded pairs in plan order; a skipped sample comes out as its error (when skipping)."""
        o = self.opts
        wanted = wanted_members(self.manifest.codec, o.scale)
        for span in spans:
            pos = span.start
            while pos < span.stop:
                try:
                    for raw in self.reader.span(Span(span.shard_index, pos, span.stop, span.rep), wanted):
                        pos = raw.index + 1
                        self.stats.add(worker, samples=1, bytes_read=raw.nbytes, read_ns=raw.read_ns, **self.reader.take_counts())
                        try:
                            pair = decode_pair(raw, self.manifest.codec, o.scale, o.verify, o.max_pixels)
                        except SampleError as exc:
                            self._skip(worker, exc)
                            yield exc
                            continue
                        self.stats.add(worker, decode_ns=pair.decode_ns, verify_ns=pair.verify_ns)
                        yield pair
                        del pair, raw  # hold nothing while the next sample is read and decoded
                except SampleError as exc:
                    self.stats.add(worker, **self.reader.take_counts())
                    lost = span.stop - pos if exc.key is None else 1
                    self._skip(worker, exc, lost)
                    for _ in range(lost):
                        yield exc
                    pos += lost

    def _patches(self, spans: list[Span], epoch: int, worker: int, fallback: list[Span]) -> Iterator[Patch]:
        """Exactly ``samples x k`` patches; skipped samples are stood in for by extra patches.

        Extra patches come from the next good sample of the slice (or the last one, read again:
        no decoded pair is held longer than its own patches need); if every sample of the slice
        failed, from the first good sample found in ``fallback``.
        """
        o = self.opts
        spec = PatchConfig(o.scale, o.patch_size, o.augment, o.min_patch_std, o.max_tries)
        k = o.patches_per_image
        owed, extra, last = 0, 0, None
        for item in self._pairs(spans, worker):
            if isinstance(item, SampleError):
                owed += k
                continue
            t0 = time.perf_counter_ns()
            try:
                patches, rejected = cut_patches(item, spec, o.seed, epoch, item.rep * k, k)
                more, r2 = cut_patches(item, spec, o.seed, epoch, _EXTRA_J + extra, owed)
            except SampleError as exc:
                self._skip(worker, exc)
                owed += k
                continue
            extra += owed
            owed = 0
            last = item.loc
            self.stats.add(worker, patches=len(patches) + len(more), rejected=rejected + r2, patch_ns=time.perf_counter_ns() - t0)
            yield from patches
            yield from more
            self.stats.mark_rss(worker)
            del item, patches, more  # the decoded pair goes before the next one is made
        if not owed:
            return
        source = [last] if last is not None else fallback
        pair = next((p for p in self._pairs(source, worker) if not isinstance(p, SampleError)), None)
        if pair is None:
            shard = self.manifest.shards[spans[0].shard_index].name if spans else "(no shard)"
            raise SampleError(shard, None, "no sample of the dataset could be read; nothing to train on")
        more, _ = cut_patches(pair, spec, o.seed, epoch, _EXTRA_J + extra, owed)
        self.stats.add(worker, patches=len(more))
        yield from more

    def check_batches(self, num_workers: int | None = None) -> None:
        """A worker whose slice holds fewer patches than one batch would yield nothing: refuse."""
        nw = max(1, self.num_workers if num_workers is None else num_workers)
        if self.opts.split is Split.TRAIN and self.batches_per_worker(nw) == 0:
            per = self.samples_per_worker(nw) * self.opts.patches_per_image
            raise ValueError(
                f"{self.url}: each of the {self.world.size} x {nw} workers gets {self.samples_per_worker(nw)} "
                f"sample(s) x {self.opts.patches_per_image} patches = {per} < batch_size {self.opts.batch_size}; "
                "lower batch_size or num_workers, or raise patches_per_image"
            )

    def _train(self, worker: int, nw: int) -> Iterator[Any]:
        o = self.opts
        self.check_batches(nw)
        epoch = self.epoch
        slot = self.world.rank * nw + worker
        plan = train_plan(self._sizes(), o.seed, epoch, self.world.size, nw)
        spans = plan[slot]
        fallback = [sp for sl in plan[slot + 1 :] + plan[:slot] for sp in sl]
        rng = np.random.default_rng([o.seed, epoch, self.world.rank, worker, 0x5348])
        t0 = time.perf_counter_ns()
        batch: list[Patch] = []
        for patch in shuffled(self._patches(spans, epoch, worker, fallback), o.shuffle_buffer, rng):
            batch.append(patch)
            if len(batch) == o.batch_size:
                out = None
                if self.handoff is not None and torch.utils.data.get_worker_info() is not None:
                    out = self.handoff.put(
                        worker, [p.lr for p in batch], [p.hr for p in batch], [p.key for p in batch] if o.return_keys else None
                    )
                if out is None:
                    out = collate(batch, o.return_keys)
                batch = []
                self.stats.add(worker, batches=1, busy_ns=time.perf_counter_ns() - t0)
                yield out
                t0 = time.perf_counter_ns()

    def _val(self, worker: int, nw: int) -> Iterator[ValSample]:
        items = val_plan(self._sizes(), self.world.size, nw)[self.world.rank * nw + worker]
        for shard, index in items:
            for pair in self._pairs([Span(shard, index, index + 1)], worker):
                if isinstance(pair, SampleError):
                    continue
                yield self._val_sample(pair)

    def _val_sample(self, pair: DecodedPair) -> ValSample:
        o = self.opts
        s = o.scale
        lh, lw = pair.lr.shape[:2]
        if o.tile is None:
            boxes = None
            lr, hr = pair.lr[None], pair.hr[None]
        else:
            boxes = tile_boxes(lh, lw, o.tile, o.tile_overlap)
            lr = np.stack([pair.lr[y : y + h, x : x + w] for y, x, h, w in boxes])
            hr = np.stack([pair.hr[s * y : s * (y + h), s * x : s * (x + w)] for y, x, h, w in boxes])
        lr_t = torch.from_numpy(_nchw(lr))
        hr_t = torch.from_numpy(_nchw(hr))
        return ValSample(lr_t, hr_t, pair.key, boxes, (lw, lh))


def _nchw(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a[:, None] if a.ndim == 3 else a.transpose(0, 3, 1, 2))


def collate(patches: list[Patch], return_keys: bool = False) -> tuple[Any, ...]:
    """Stack patches into ``lr [B,C,p,p]``, ``hr [B,C,sp,sp]`` (used where no slot pool is)."""
    lr = torch.from_numpy(np.stack([p.lr for p in patches]))
    hr = torch.from_numpy(np.stack([p.hr for p in patches]))
    return (lr, hr, [p.key for p in patches]) if return_keys else (lr, hr)


__getattr__ = _compat.module_getattr(__name__, {"Options": ("wdsr.dataset.DatasetConfig", DatasetConfig)})
