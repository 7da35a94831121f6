"""Shuffle a stream's patches and batch them, in the worker: into a handoff slot or new tensors."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from wdsr import env
from wdsr.pipeline.degraded import ParamRows, as_batch, param_rows
from wdsr.pipeline.elastic import ChunkStream
from wdsr.pipeline.handoff import BatchPool, SlotRef, write_rows
from wdsr.pipeline.patches import Patch
from wdsr.pipeline.shuffle import fast_forward, shuffled
from wdsr.pipeline.stats import SharedStats
from wdsr.pipeline.stream import TrainStream


def train_batches(
    stream: TrainStream | ChunkStream,
    batch_size: int,
    shuffle_buffer: int,
    rng: np.random.Generator,
    skip_batches: int,
    worker: int,
    pool: BatchPool | None,
    return_keys: bool,
    stats: SharedStats,
) -> Iterator[Any]:
    """Shuffle ``stream``'s patches and batch them; the first ``skip_batches`` batches are
    skipped without reading what they held (the shuffle is fast-forwarded by position)."""
    start = fast_forward(shuffle_buffer, rng, stream.total, skip_batches * batch_size)
    stream.wait_for(start.buffer if start.tail is None else start.tail)
    patches = shuffled(stream.patches(start.next_input), shuffle_buffer, rng, start, stream.resolve)
    in_worker = env.in_worker()
    t0 = time.perf_counter_ns()
    batch: list[Patch] = []
    for patch in patches:
        batch.append(patch)
        if len(batch) == batch_size:
            t1 = time.perf_counter_ns()
            keys = [p.key for p in batch] if return_keys else None
            params = param_rows(batch)  # degrade=: the patches' degradation parameters
            out: SlotRef | tuple[Any, ...] | None = None
            if pool is not None and in_worker:
                out = pool.put_patches(worker, batch, keys, params)
            if out is None:
                out = collate(batch, return_keys, params)
                if not in_worker:
                    out = as_batch(out)
            batch = []
            t2 = time.perf_counter_ns()
            stats.add(worker, batches=1, busy_ns=t2 - t0, patch_ns=t2 - t1)  # patch_ns: each patch's cut and its write
            yield out
            t0 = time.perf_counter_ns()


def collate(patches: Sequence[Patch], return_keys: bool = False, params: ParamRows | None = None) -> tuple[Any, ...]:
    """Patches into new ``lr [B,C,p,p]``, ``hr [B,C,sp,sp]`` tensors (where no slot pool is);
    with degradation ``params`` (``degrade=``), ``(hr, params)``."""
    first = patches[0]
    lr = np.empty((len(patches),) + first.lr_shape, dtype=first.dtype)
    hr = np.empty((len(patches),) + first.hr_shape, dtype=first.dtype)
    write_rows(patches, lr, hr)
    out: tuple[Any, ...] = (torch.from_numpy(lr), torch.from_numpy(hr)) if params is None else (torch.from_numpy(hr), params)
    return (*out, [p.key for p in patches]) if return_keys else out
