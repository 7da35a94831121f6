"""Who reads what: a pure function of (shard sizes, seed, epoch, world size, workers).

Training: shards are permuted with (seed, epoch), their samples laid out in one sequence, and the
sequence cut into ``world_size x num_workers`` contiguous slices of equal length, padded by
wrapping around, so every rank and worker gets exactly the same number of samples, even with
fewer shards than workers. Validation: manifest order, every sample exactly once, no padding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from wdsr import seeds


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


class SampleRef(NamedTuple):
    """Sample ``sample`` (its place in the shard) of the shard at ``shard_index`` in the manifest;
    ``rep`` as in :class:`Span`."""

    shard_index: int
    sample: int
    rep: int = 0


def shard_order(n_shards: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's shard permutation."""
    return seeds.shard_order(seed, epoch).permutation(n_shards)


def slice_length(total: int, slices: int) -> int:
    if total < 1:
        raise ValueError("the dataset has no samples")
    return math.ceil(total / slices)


def whole_batches(patches: int, batch_size: int) -> int:
    """Batches a worker slot yields from ``patches`` patches: whole batches only; the patches left
    over are never read (the one rule for every count of batches: ``len(loader)``, resume, elastic)."""
    return patches // batch_size


def slot_batches(samples: int, world_size: int, num_workers: int, k: int, batch_size: int) -> int:
    """Batches per worker slot of an epoch of ``samples`` samples over ``world_size x num_workers`` slots."""
    return whole_batches(slice_length(samples, world_size * max(1, num_workers)) * k, batch_size)


class TrainPlan:
    """One epoch's layout, computed once: the shard order and where each shard starts in the
    sample sequence. A slot's spans come on demand (:meth:`slot`), so a worker pays for its own
    slot only, not for all ``world_size x num_workers`` of them."""

    def __init__(
        self,
        shard_sizes: Sequence[int],
        seed: int,
        epoch: int,
        world_size: int,
        num_workers: int,
        segments: np.ndarray | None = None,
    ) -> None:
        """``segments`` (a mix, see :func:`mix_segments`): ``[n, 4]`` rows (shard, first sample,
        count, rep) laid out in that order instead of the shards permuted by (seed, epoch)."""
        if world_size < 1 or num_workers < 1:
            raise ValueError(f"world_size and num_workers must be >= 1, got {world_size}, {num_workers}")
        if segments is None:
            sizes = np.asarray(shard_sizes, dtype=np.int64)
            order = shard_order(len(sizes), seed, epoch)
            keep = order[sizes[order] > 0]
            segments = np.stack([keep, np.zeros_like(keep), sizes[keep], np.zeros_like(keep)], axis=1)
        segments = segments[segments[:, 2] > 0]
        self._shards, self._firsts, self._counts, self._reps = (segments[:, c] for c in range(4))
        self._rep_span = int(self._reps.max()) + 1 if len(segments) else 1  # a wrap-around repeats with new patch indices
        self._starts = np.concatenate([[0], np.cumsum(self._counts)])
        self.total = int(self._starts[-1])
        self.slots = world_size * num_workers
        self.length = slice_length(self.total, self.slots)

    def __len__(self) -> int:
        return self.slots

    def __getitem__(self, slot: int) -> list[Span]:
        return self.slot(slot)

    def slot(self, slot: int) -> list[Span]:
        """Spans of slot ``rank * num_workers + worker``: positions ``slot*length ..`` of the
        sequence, wrapped around past its end."""
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} of {self.slots}")
        out: list[Span] = []
        pos, end = slot * self.length, (slot + 1) * self.length
        while pos < end:
            wrap, p = divmod(pos, self.total)
            i = int(np.searchsorted(self._starts, p, side="right")) - 1
            into = p - int(self._starts[i])
            take = min(int(self._counts[i]) - into, end - pos)
            first = int(self._firsts[i]) + into
            out.append(Span(int(self._shards[i]), first, first + take, int(self._reps[i]) + wrap * self._rep_span))
            pos += take
        return out

    def others(self, slot: int) -> Iterator[Span]:
        """The other slots' spans, from the next slot on, wrapping (where stand-ins are looked for
        when every sample of ``slot`` failed)."""
        for t in list(range(slot + 1, self.slots)) + list(range(slot)):
            yield from self.slot(t)


def mix_segments(sources: Sequence[Sequence[int]], counts: Sequence[int], seed: int, epoch: int) -> np.ndarray:
    """The layout of a mix: source ``i`` (its shard sizes, numbered after the previous sources'
    shards) gives ``counts[i]`` samples this epoch, from its own (seed, epoch) shard order, wrapping
    around (with the next ``rep``) when it gives more than it has; then every source's segments are
    permuted together by (seed, epoch), so sources mix at shard granularity."""
    rows = []
    base = 0
    for i, (sizes, want) in enumerate(zip(sources, counts, strict=True)):
        sz = np.asarray(sizes, dtype=np.int64)
        order = seeds.mix_source_order(seed, epoch, i).permutation(len(sz))
        order = order[sz[order] > 0]
        left, rep = int(want), 0
        while left > 0 and len(order):
            for sh in order:
                take = min(int(sz[sh]), left)
                rows.append((base + int(sh), 0, take, rep))
                left -= take
                if not left:
                    break
            rep += 1
        base += len(sz)
    seg = np.array(rows, dtype=np.int64).reshape(-1, 4)
    return seg[seeds.mix_segment_order(seed, epoch).permutation(len(seg))]


def mix_counts(samples: Sequence[int], weights: Sequence[float] | None, total: int | None = None) -> list[int]:
    """Samples each source gives per epoch: all of each without weights; else the largest-remainder
    shares of ``total`` (default: the union's size) by weight."""
    if weights is None:
        return [int(n) for n in samples]
    if len(weights) != len(samples) or any(w < 0 for w in weights) or not sum(weights) > 0:
        raise ValueError(f"weights must be one non-negative number per source, not all 0, got {list(weights)}")
    total = sum(samples) if total is None else total
    exact = [total * w / sum(weights) for w in weights]
    out = [int(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: out[i] - exact[i])[: total - sum(out)]:
        out[i] += 1
    return out


def train_plan(shard_sizes: Sequence[int], seed: int, epoch: int, world_size: int, num_workers: int) -> list[list[Span]]:
    """Every slot's spans; slot ``rank * num_workers + worker`` belongs to that worker."""
    plan = TrainPlan(shard_sizes, seed, epoch, world_size, num_workers)
    return [plan.slot(s) for s in range(plan.slots)]


def slot_plan(shard_sizes: Sequence[int], seed: int, epoch: int, world_size: int, num_workers: int, slot: int) -> list[Span]:
    """One slot's spans, without computing the others."""
    return TrainPlan(shard_sizes, seed, epoch, world_size, num_workers).slot(slot)


def val_plan(shard_sizes: Sequence[int], world_size: int, num_workers: int) -> list[list[SampleRef]]:
    """``(shard, sample)`` lists per slice: manifest order, each sample exactly once, no padding.

    A rank gets a contiguous block of the sequence; inside it, sample ``n`` goes to worker
    ``n % num_workers``, so a DataLoader (which takes items from its workers in turn) returns
    the rank's samples in manifest order.
    """
    if world_size < 1 or num_workers < 1:
        raise ValueError(f"world_size and num_workers must be >= 1, got {world_size}, {num_workers}")
    seq = [SampleRef(s, i) for s, n in enumerate(shard_sizes) for i in range(n)]
    out: list[list[SampleRef]] = []
    for r in range(world_size):
        block = seq[r * len(seq) // world_size : (r + 1) * len(seq) // world_size]
        out += [block[w::num_workers] for w in range(num_workers)]
    return out
