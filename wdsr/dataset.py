"""``SRDataset``: configuration + manifest + the sources that read them; its passes are put together
by ``wdsr.pipeline.epoch`` (train) and ``wdsr.pipeline.val``.

The dataset holds what a run reads and how, and the world it was made in; it is never changed by a
loader. The epoch, the workers, the batches already handed out and the shared-memory slots belong
to the loader (``wdsr.loader``), which passes them to the workers with each pass; the dataset's
``set_epoch`` only tells its loaders.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from shardmaker import deprecation
from shardmaker import format as fmt
from shardmaker.errors import OnError, brief
from wdsr import env
from wdsr.config import DatasetConfig, Split
from wdsr.pipeline import clipval
from wdsr.pipeline.batch import collate
from wdsr.pipeline.checks import Kind, Verify
from wdsr.pipeline.elastic import ElasticPlan, elastic_plan
from wdsr.pipeline.epoch import Slot, elastic_pass, train_pass
from wdsr.pipeline.handoff import BatchPool
from wdsr.pipeline.kinds import check_modes
from wdsr.pipeline.patches import too_small
from wdsr.pipeline.plan import (
    Span,
    TrainPlan,
    check_mix_segments,
    mix_counts,
    mix_segments,
    slice_length,
    slot_batches,
    val_plan,
)
from wdsr.pipeline.read import ShardReader
from wdsr.pipeline.sample import LrMode
from wdsr.pipeline.source import ErrorPolicy, MixSource, Source
from wdsr.pipeline.stats import SharedStats
from wdsr.pipeline.val import ValSample, val_pass
from wdsr.store import presence, urls
from wdsr.store.decoded import DecodedCache

log = logging.getLogger("wdsr")

__all__ = ["DatasetConfig", "OnError", "SRDataset", "Split", "ValSample", "collate"]


class SRDataset(IterableDataset):
    """Stream aligned (LR, HR) patch batches from a ``wdsr-shards/1`` dataset.

    ``SRDataset(url, scale=4, patch_size=192, ...)`` or ``SRDataset(url, config=DatasetConfig(...))``:
    the options are :class:`wdsr.DatasetConfig`'s fields, keyword-only.

    Train: every rank gets the same number of batches; batches are uint8 (or uint16) tensors
    ``lr [B,C,p,p]``, ``hr [B,C,s*p,s*p]`` made in the workers. Val: every image once across
    ranks, in manifest order, whole or tiled. Use :func:`wdsr.make_loader` to build the loader;
    it owns the epoch and the position (``loader.state_dict()`` resumes mid-epoch).

    Remote URLs (``s3://...``; credentials, region and endpoint from the standard AWS variables
    or ``storage_options``) are read with range requests that ``retry`` and resume at the byte
    reached; ``read_ahead`` samples are fetched while one is decoded; ``cache_dir`` keeps whole
    shards on local disk (``cache_limit`` bytes, least recently used evicted) for later epochs.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        config: DatasetConfig | None = None,
        *,
        manifest: str | None = None,
        weights: Sequence[float] | None = None,
        epoch_samples: int | None = None,
        storage_options: dict[str, Any] | None = None,
        world: env.World | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        if config is not None and not isinstance(config, DatasetConfig):
            raise TypeError(f"SRDataset({url!r}, ...): options are keyword-only (scale=..., patch_size=...), got {config!r}")
        self.config = DatasetConfig.from_options(config, **options)
        self.world = world if world is not None else env.current_world()
        self.stats = SharedStats()
        errors = ErrorPolicy(self.config.on_error, self.stats)
        folders = urls.dataset_folders(url)
        if folders is None:  # one dataset: a folder, or shards chosen by a pattern or list
            if weights is not None or epoch_samples is not None:
                raise ValueError("weights= and epoch_samples= mix several datasets: give a list of dataset folders")
            where = urls.resolve(url, manifest)
            full = fmt.load(where.folder, storage_options, compact=True, name=where.manifest)  # numpy columns
            parts = [(where.folder, urls.select(full, where, storage_options))]
        else:
            if manifest is not None:
                raise ValueError("manifest= names one dataset's manifest; a mix reads each folder's own")
            _refuse_duplicates(folders)
            parts = [(f, fmt.load(f, storage_options, compact=True)) for f in folders]
            _refuse_duplicates(folders, [m.digest for _, m in parts])
        kind = Kind.of(parts)  # one for all sources of a mix: their batches are stacked together
        if self.config.degrade is not None:  # 8-bit RGB or nothing: a sample of another kind is refused from its header
            kind.channels, kind.bit_depth, kind.required_by = kind.channels or 3, kind.bit_depth or 8, "degrade="
        sources = []
        c = self.config
        lr = LrMode.DEGRADE if c.degrade is not None else c.lr  # where LR comes from: stored, made per patch or on the device
        for folder, m in parts:
            lr_source = check_modes(folder, m, c.scale, lr, c.clip)  # the kind x LR source x clip= the table allows
            if m.members is not None and self.config.verify is Verify.SHA256:
                raise ValueError(
                    f"{folder}: verify='sha256' needs sha256 digests per member; an index of foreign shards "
                    "(shardmaker index) records xxh3_64: use verify='xxh3_64'"
                )
            self._check_patches_fit(folder, m)
            self._check_clips(folder, m)
            reader = ShardReader(folder, m, storage_options, self.config.read_config())
            cache = self._decoded_cache(m, parts)
            cache = cache if lr_source.cacheable else None  # the decoded cache keeps stored pairs
            sources.append(
                Source(reader, c.scale, c.verify, c.max_pixels, self.stats, errors, cache, kind, c.clip, lr, c.degrade)
            )
        self.url = parts[0][0]  # the (first) dataset folder
        self.reader = sources[0].reader
        self.manifest, self._source, self.mix = _combine(parts, sources, weights, epoch_samples)
        self.identity = self.manifest.digest  # tells datasets (and mixes) apart in a saved state
        self.requested_epoch: int | None = None  # the last set_epoch(); loaders made later start there
        self._loaders: weakref.WeakSet[Any] = weakref.WeakSet()  # told of each set_epoch()

    def _check_patches_fit(self, folder: str, m: fmt.Manifest) -> None:
        """Samples whose LR is smaller than the LR patch, counted from the manifest before any read:
        an error under ``on_error="fail"`` (or when none is left), a warning under ``skip``."""
        c = self.config
        if c.split is not Split.TRAIN:
            return
        bad, total, key, (w, h) = too_small(m.shards, c.scale, c.patch_size)
        if not bad:
            return
        p = c.patch_size // c.scale
        what = (
            f"{bad} of {total} samples have an LR smaller than the LR patch {p}x{p} "
            f"(patch_size {c.patch_size} / scale {c.scale}; e.g. {key!r}: LR {w}x{h})"
        )
        if c.on_error is OnError.FAIL or bad == total:
            raise ValueError(
                f"{folder}: {what}; lower patch_size" + ("" if bad == total else ", or skip them with on_error='skip'")
            )
        log.warning("%s: %s; they are skipped (on_error='skip')", folder, what)

    def _check_clips(self, folder: str, m: fmt.Manifest) -> None:
        """Clip validation: its settings, and every key a segment's, each once (refused here, not in a worker)."""
        c = self.config
        if c.clip is not None and c.split is Split.VAL:
            clipval.check_val(folder, c.clip, c.tile)
            clipval.clip_plan(m.shards)  # every key a segment's, each once: refused here, not in a worker

    def _decoded_cache(self, m: fmt.Manifest, parts: list[tuple[str, fmt.Manifest]]) -> DecodedCache | None:
        """This dataset's part of the node-wide decoded cache; in a mix, each source gets the share
        of ``decoded_cache_limit`` its pixels are of the union's."""
        c = self.config
        if c.decoded_cache is None:
            return None
        limit = c.decoded_cache_limit
        if limit is not None and len(parts) > 1:

            def pixels(man: fmt.Manifest) -> int:
                return sum(int(np.asarray(sh.hr_sizes, dtype=np.int64).reshape(-1, 2).prod(axis=1).sum()) for sh in man.shards)

            limit = max(1, limit * pixels(m) // max(1, sum(pixels(p) for _, p in parts)))
        return DecodedCache(c.decoded_cache, m.digest, c.scale, limit, m.shards)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"SRDataset({self.url!r}, split={c.split.value}, scale={c.scale}, patch_size={c.patch_size}, "
            f"patches_per_image={c.patches_per_image}, batch_size={c.batch_size}, samples={self.manifest.samples}, "
            f"rank={self.world.rank}/{self.world.size})"
        )

    @property
    def opts(self) -> DatasetConfig:
        deprecation.warn("SRDataset.opts", "SRDataset.config")
        return self.config

    def __getstate__(self) -> dict[str, Any]:  # what a DataLoader worker gets: not the loaders
        return {k: v for k, v in self.__dict__.items() if k != "_loaders"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._loaders = weakref.WeakSet()

    # ---- epochs and sizes -------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Ask every loader of this dataset (and those made later) for ``epoch`` (shard order, patch
        positions) at its next pass, persistent workers included; the loaders own the epoch
        (``loader.set_epoch`` asks one loader)."""
        self.requested_epoch = int(epoch)
        for loader in list(self._loaders):
            loader.set_epoch(epoch)

    def attach(self, loader: Any) -> None:
        """A loader of this dataset: told of later ``set_epoch`` calls."""
        self._loaders.add(loader)

    @property
    def epoch(self) -> int:
        deprecation.warn("SRDataset.epoch", "SRLoader.epoch (the loader owns the epoch counter)")
        return self.requested_epoch or 0

    def _sizes(self) -> list[int]:
        per = getattr(self.manifest.shards, "samples_per_shard", None)  # a column index's table: no entry made
        return per().tolist() if per is not None else [s.samples for s in self.manifest.shards]

    @property
    def epoch_samples(self) -> int:
        """Samples per training epoch: the dataset's, or the sum of a mix's per-source counts."""
        return self.manifest.samples if self.mix is None else sum(self.mix.counts)

    def train_plan(self, epoch: int, world_size: int, num_workers: int) -> TrainPlan:
        """The epoch's plan for ``world_size x num_workers`` slots (a mix's sources laid out together)."""
        c = self.config
        if self.mix is None:
            return TrainPlan(self._sizes(), c.seed, epoch, world_size, max(1, num_workers))
        segments = mix_segments(self.mix.sizes, self.mix.counts, c.seed, epoch)
        return TrainPlan((), c.seed, epoch, world_size, max(1, num_workers), segments=segments)

    def samples_per_worker(self, num_workers: int = 0) -> int:
        return slice_length(self.epoch_samples, self.world.size * max(1, num_workers))

    def batches_per_worker(self, num_workers: int = 0, world_size: int | None = None) -> int:
        """Batches per worker of a loader with ``num_workers`` workers, in this world or one of ``world_size`` ranks."""
        c = self.config
        size = self.world.size if world_size is None else world_size
        return slot_batches(self.epoch_samples, size, num_workers, c.patches_per_image, c.batch_size)

    def batches_per_worker_in(self, world_size: int, num_workers: int) -> int:
        return self.batches_per_worker(num_workers, world_size)

    def __len__(self) -> int:
        """Train: batches per rank per epoch without workers (``len(loader)`` for a loader's). Val: this rank's images."""
        return self.length(0)

    def length(self, num_workers: int) -> int:
        """``len()`` of a loader with ``num_workers`` workers: batches (train) or images (val) per rank per epoch."""
        nw = max(1, num_workers)
        if self.config.split is Split.VAL:
            return sum(len(s) for s in val_plan(self._sizes(), self.world.size, nw)[self.world.rank * nw :][:nw])
        return nw * self.batches_per_worker(nw)

    def check_batches(self, num_workers: int = 0) -> None:
        """A worker whose slice holds fewer patches than one batch would yield nothing: refuse."""
        nw = max(1, num_workers)
        c = self.config
        if c.split is Split.TRAIN and self.batches_per_worker(nw) == 0:
            per = self.samples_per_worker(nw) * c.patches_per_image
            raise ValueError(
                f"{self.url}: each of the {self.world.size} x {nw} workers gets {self.samples_per_worker(nw)} "
                f"sample(s) x {c.patches_per_image} patches = {per} < batch_size {c.batch_size}; "
                "lower batch_size or num_workers, or raise patches_per_image"
            )

    def check_shards(self) -> None:
        """Every shard this dataset reads is there with the manifest's size (one listing per folder):
        :class:`~wdsr.store.presence.ShardsMissing` (a ``ValueError``) naming the first that are not."""
        sources = self._source.sources if isinstance(self._source, MixSource) else [self._source]
        for s in sources:
            presence.check_present(s.reader.url, s.reader.manifest, s.reader.storage_options)

    # ---- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """One pass at the epoch last asked for with ``set_epoch`` (0 by default), in the current
        worker; a loader's passes go through :meth:`stream` instead."""
        worker, nw = env.current_worker()
        return self.stream(worker, nw, self.requested_epoch or 0)

    def stream(
        self,
        worker: int,
        num_workers: int,
        epoch: int,
        skip_batches: int = 0,
        pool: BatchPool | None = None,
        slot_worker: int | None = None,
        origin: tuple[int, int, int] | None = None,
    ) -> Iterator[Any]:
        """Worker ``slot_worker`` (default ``worker``)'s part of ``epoch``, after its first
        ``skip_batches`` batches; batches go through ``pool``'s slots of DataLoader worker ``worker``.

        ``origin`` (old world size, old workers, batches per rank): the rest of an epoch another
        world had run that far into, re-planned over this world (:func:`elastic_plan`)."""
        nw = max(1, num_workers)
        c = self.config
        if c.split is Split.VAL and c.clip is not None:
            clips = clipval.clip_val_plan(self.manifest.shards, self.world.size, nw)[self.world.rank * nw + worker]
            return clipval.clip_val_pass(self._source, clips, worker, c.clip)
        if c.split is Split.VAL:
            items = val_plan(self._sizes(), self.world.size, nw)[self.world.rank * nw + worker]
            return val_pass(self._source, items, worker, c.scale, c.tile, c.tile_overlap)
        self.check_batches(num_workers)
        slot = Slot(self.world.rank, nw, worker, worker if slot_worker is None else slot_worker, skip_batches)
        if origin is None:
            plan = self.train_plan(epoch, self.world.size, nw)
            return train_pass(self._source, c.stream_config(), epoch, plan, slot, pool, self.stats)
        old = self.train_plan(epoch, origin[0], origin[1])
        el = self.elastic_plan(epoch, origin, nw)
        return elastic_pass(self._source, c.stream_config(), epoch, old, el, slot, pool, self.stats)

    def decoded_in_order(self) -> Iterator[Any]:
        """Every usable sample decoded as the train stream decodes it, in manifest order (``wdsr preview``)."""
        for i, shard in enumerate(self.manifest.shards):
            for pair in self._source.pairs([Span(i, 0, len(shard.keys), 0)], 0):
                if pair is not None:
                    yield pair

    def elastic_plan(self, epoch: int, origin: tuple[int, int, int], num_workers: int) -> ElasticPlan:
        """The rest of ``epoch`` after ``origin`` = (world size, workers, batches per rank), over this world."""
        c = self.config
        return elastic_plan(
            self.train_plan(epoch, origin[0], origin[1]).length,
            c.seed,
            epoch,
            c.patches_per_image,
            c.shuffle_buffer,
            c.batch_size,
            origin,
            self.world.size * max(1, num_workers),
        )


@dataclasses.dataclass(frozen=True)
class Mix:
    """Several datasets streamed as one: each source's shard sizes, its samples per epoch, its weight."""

    folders: tuple[str, ...]
    sizes: tuple[tuple[int, ...], ...]
    counts: tuple[int, ...]
    weights: tuple[float, ...] | None


def _dataset_identity(url: str) -> str:
    """What a dataset folder URL names: a local path (plain or ``file://``) resolved (symlinks, ``..``,
    trailing slashes), a remote URL with its protocol in lower case and its path without repeated or
    trailing slashes. Two folders of one identity are one dataset."""
    proto, sep, rest = url.partition("://")
    if not sep or proto.lower() in ("file", "local"):
        return os.path.realpath(rest if sep else url)
    return f"{proto.lower()}://{re.sub('/+', '/', rest).strip('/')}"


def _refuse_duplicates(folders: Sequence[str], digests: Sequence[str] | None = None) -> None:
    """A mix names each dataset once: the same folder under two spellings (``file:///x``, ``/x/``, a
    symlink), or (with ``digests``) two folders holding the same manifest, is refused rather than
    counted twice; a larger weight says the same thing on purpose."""
    seen: dict[str, int] = {}
    for i, folder in enumerate(folders):
        ident = _dataset_identity(folder) if digests is None else digests[i]
        if ident in seen:
            j = seen[ident]
            what = "the same folder" if digests is None else "the same dataset (identical manifests)"
            raise ValueError(
                f"datasets {j} ({brief(folders[j])}) and {i} ({brief(folder)}) are {what}: a dataset given twice "
                "would count twice; give it once, with a larger weight instead"
            )
        seen[ident] = i


def _combine(
    parts: list[tuple[str, fmt.Manifest]], sources: list[Source], weights: Sequence[float] | None, epoch_samples: int | None
) -> tuple[fmt.Manifest, Source | MixSource, Mix | None]:
    """One manifest-like view over the parts (shards numbered one source after the other), the
    source that reads them, and the mix (None for a single dataset)."""
    if len(parts) == 1 and weights is None and epoch_samples is None:
        return parts[0][1], sources[0], None
    sizes = tuple(tuple(s.samples for s in m.shards) for _, m in parts)
    counts = tuple(mix_counts([m.samples for _, m in parts], weights, epoch_samples))
    check_mix_segments(sizes, counts)  # the epoch's layout is bounded before it is ever made
    mix = Mix(tuple(f for f, _ in parts), sizes, counts, tuple(float(w) for w in weights) if weights is not None else None)
    codecs = sorted({m.codec for _, m in parts})
    doc = json.dumps({"mix": [m.digest for _, m in parts], "counts": counts, "weights": mix.weights}, sort_keys=True)
    first = parts[0][1]
    combined = fmt.Manifest(
        codecs[0] if len(codecs) == 1 else "+".join(codecs),
        sorted(set.intersection(*(set(m.scales) for _, m in parts))),
        first.lr_method,
        [s for _, m in parts for s in m.shards],
        {"mix": list(mix.folders), "counts": list(counts)},
        identity=hashlib.sha256(doc.encode()).hexdigest(),
    )
    return combined, MixSource(sources), mix


__getattr__ = deprecation.module_getattr(__name__, {"Options": ("wdsr.dataset.DatasetConfig", DatasetConfig)})
