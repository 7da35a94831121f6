"""One worker's train pass over an epoch, put together from the stages: the slot's plan ->
:class:`TrainStream` (or, for the rest of an epoch re-planned over a new world, a
:class:`ChunkStream` over the old slots' streams) -> shuffle -> batches."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from wdsr import seeds
from wdsr.pipeline.batch import train_batches
from wdsr.pipeline.elastic import ChunkStream, ElasticPlan
from wdsr.pipeline.handoff import BatchPool
from wdsr.pipeline.patches import PatchConfig
from wdsr.pipeline.plan import TrainPlan
from wdsr.pipeline.source import MixSource, Source
from wdsr.pipeline.stats import SharedStats
from wdsr.pipeline.stream import TrainStream


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """What a train pass needs of the dataset's settings (``DatasetConfig.stream_config()``)."""

    patch: PatchConfig
    patches_per_image: int
    batch_size: int
    shuffle_buffer: int
    seed: int
    return_keys: bool = False


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where a pass runs: rank ``rank`` of the world, DataLoader worker ``worker`` of ``workers``,
    playing worker slot ``as_worker`` (the loader rotates them on a resumed pass), its first
    ``skip_batches`` batches already handed out."""

    rank: int
    workers: int
    worker: int
    as_worker: int
    skip_batches: int = 0

    @property
    def index(self) -> int:
        return self.rank * self.workers + self.as_worker


def train_pass(
    source: Source | MixSource,
    cfg: StreamConfig,
    epoch: int,
    plan: TrainPlan,
    slot: Slot,
    pool: BatchPool | None,
    stats: SharedStats,
) -> Iterator[Any]:
    """The batches of ``slot`` in ``epoch`` of ``plan``."""
    stream = TrainStream(source, cfg.patch, cfg.patches_per_image, cfg.seed, epoch, plan, slot.index, slot.worker)
    rng = seeds.shuffle(cfg.seed, epoch, slot.rank, slot.as_worker)
    return _batches(stream, cfg, rng, slot, pool, stats)


def elastic_pass(
    source: Source | MixSource,
    cfg: StreamConfig,
    epoch: int,
    old_plan: TrainPlan,
    elastic: ElasticPlan,
    slot: Slot,
    pool: BatchPool | None,
    stats: SharedStats,
) -> Iterator[Any]:
    """The batches of new slot ``slot`` of ``elastic``: its run of the positions the old world's
    slots (planned by ``old_plan``) had not handed out."""
    chunk = elastic.chunk(slot.index)
    k = cfg.patches_per_image
    streams = {
        int(s): TrainStream(source, cfg.patch, k, cfg.seed, epoch, old_plan, int(s), slot.worker) for s in np.unique(chunk[:, 0])
    }
    rng = seeds.elastic_shuffle(cfg.seed, epoch, slot.rank, slot.as_worker)
    return _batches(ChunkStream(streams, chunk, k), cfg, rng, slot, pool, stats)


def _batches(
    stream: TrainStream | ChunkStream,
    cfg: StreamConfig,
    rng: np.random.Generator,
    slot: Slot,
    pool: BatchPool | None,
    stats: SharedStats,
) -> Iterator[Any]:
    return train_batches(
        stream, cfg.batch_size, cfg.shuffle_buffer, rng, slot.skip_batches, slot.worker, pool, cfg.return_keys, stats
    )
