"""Who reads what: a pure function of (shard sizes, seed, epoch, world size, workers).

Training: shards are permuted with (seed, epoch), their samples laid out in one sequence, and the
sequence cut into ``world_size x num_workers`` contiguous slices of equal length, padded by
wrapping around, so every rank and worker gets exactly the same number of samples, even with
fewer shards than workers. Validation: manifest order, every sample exactly once, no padding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Span:
    """Samples ``start..stop-1`` of the shard at ``shard_index`` in the manifest, read in order.

    ``rep`` counts wrap-arounds: 0 for the first pass over the data, 1+ for padding repeats.
    """

    shard_index: int  # position in the manifest; ``shard`` elsewhere is always a name
    start: int
    stop: int
    rep: int = 0

    def __len__(self) -> int:
        return self.stop - self.start


def shard_order(n_shards: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's shard permutation."""
    return np.random.default_rng([seed, epoch, 0x5A4D]).permutation(n_shards)


def slice_length(total: int, slices: int) -> int:
    if total < 1:
        raise ValueError("the dataset has no samples")
    return math.ceil(total / slices)


def _spans(layout: list[tuple[int, int]], begin: int, end: int, total: int) -> list[Span]:
    """Spans covering positions ``begin..end-1`` of the (wrapped) sample sequence."""
    starts = np.cumsum([0] + [n for _, n in layout])
    out: list[Span] = []
    pos = begin
    while pos < end:
        rep, p = divmod(pos, total)
        i = int(np.searchsorted(starts, p, side="right")) - 1
        shard, n = layout[i]
        first = p - int(starts[i])
        take = min(n - first, end - pos)
        out.append(Span(shard, first, first + take, rep))
        pos += take
    return out


def train_plan(shard_sizes: Sequence[int], seed: int, epoch: int, world_size: int, num_workers: int) -> list[list[Span]]:
    """One list of spans per slice; slice ``rank * num_workers + worker`` belongs to that worker."""
    if world_size < 1 or num_workers < 1:
        raise ValueError(f"world_size and num_workers must be >= 1, got {world_size}, {num_workers}")
    order = shard_order(len(shard_sizes), seed, epoch)
    layout = [(int(i), int(shard_sizes[i])) for i in order if shard_sizes[i] > 0]
    total = sum(n for _, n in layout)
    slices = world_size * num_workers
    length = slice_length(total, slices)
    return [_spans(layout, s * length, (s + 1) * length, total) for s in range(slices)]


def val_plan(shard_sizes: Sequence[int], world_size: int, num_workers: int) -> list[list[tuple[int, int]]]:
    """``(shard, sample)`` lists per slice: manifest order, each sample exactly once, no padding.

    A rank gets a contiguous block of the sequence; inside it, sample ``n`` goes to worker
    ``n % num_workers``, so a DataLoader (which takes items from its workers in turn) returns
    the rank's samples in manifest order.
    """
    if world_size < 1 or num_workers < 1:
        raise ValueError(f"world_size and num_workers must be >= 1, got {world_size}, {num_workers}")
    seq = [(s, i) for s, n in enumerate(shard_sizes) for i in range(n)]
    out: list[list[tuple[int, int]]] = []
    for r in range(world_size):
        block = seq[r * len(seq) // world_size : (r + 1) * len(seq) // world_size]
        out += [block[w::num_workers] for w in range(num_workers)]
    return out
