"""Elastic resume: the rest of an epoch that one world had run into, re-planned over another world
(:class:`ElasticPlan`), and a new slot's run of it streamed through the old slots' streams
(:class:`ChunkStream`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from wdsr import seeds
from wdsr.pipeline.patches import Patch
from wdsr.pipeline.shuffle import fast_forward
from wdsr.pipeline.stream import TrainStream

REPLAN_SLOTS = 1 << 12  # old slots an elastic re-plan may replay beyond one per sample of the dataset


def replan_limit(samples: int) -> int:
    """The most old slots (world size x workers) a re-plan of an epoch of ``samples`` samples replays:
    each slot's shuffle is replayed, so the work must follow the dataset, not a number in a saved state
    (one slot per sample, or ``REPLAN_SLOTS`` for a small dataset: about 0.5 s here)."""
    return max(samples, REPLAN_SLOTS)


@dataclasses.dataclass(frozen=True)
class ElasticPlan:
    """The rest of an epoch that ``old_world x old_workers`` slots had run ``batches`` batches
    into (per rank), re-planned over ``slots`` new slots: the remaining positions of every old
    slot, in old-slot and position order, cut into ``slots`` equal runs of ``per_slot``.

    How many positions an old slot has left is known without replaying its shuffle (everything
    not yet handed out), so a new slot replays only the one or two old slots its run overlaps."""

    seed: int
    epoch: int
    k: int
    shuffle_buffer: int
    batch_size: int
    origin: tuple[int, int, int]  # old world size, old workers, batches per rank
    slots: int
    remaining: np.ndarray  # per old slot: positions not handed out
    length: int  # samples per old slot

    @property
    def per_slot(self) -> int:
        return int(self.remaining.sum()) // self.slots

    @property
    def dropped(self) -> int:
        return int(self.remaining.sum()) - self.per_slot * self.slots

    def _positions(self, old_slot: int) -> np.ndarray:
        """The positions old slot ``old_slot`` had not handed out, in order (its shuffle replayed)."""
        nw = max(1, self.origin[1])
        r, w = divmod(old_slot, nw)
        done = max(0, (self.origin[2] - w + nw - 1) // nw)
        total = self.length * self.k
        rng = seeds.shuffle(self.seed, self.epoch, r, w)
        at = fast_forward(self.shuffle_buffer, rng, total, done * self.batch_size)
        waiting = np.array(at.buffer if at.tail is None else at.tail, dtype=np.int64)
        rest = np.arange(at.next_input, total, dtype=np.int64) if at.tail is None else np.empty(0, np.int64)
        return np.sort(np.concatenate([waiting, rest]))

    def chunk(self, slot: int) -> np.ndarray:
        """``[per_slot, 2]`` (old slot, position) items of new slot ``slot``."""
        begin, end = slot * self.per_slot, (slot + 1) * self.per_slot
        starts = np.concatenate([[0], np.cumsum(self.remaining)])
        parts = []
        first = max(0, int(np.searchsorted(starts, begin, side="right")) - 1)  # the old slots the run overlaps
        last = int(np.searchsorted(starts, end, side="left"))
        for old in range(first, min(last, len(self.remaining))):
            lo, hi = max(begin, int(starts[old])), min(end, int(starts[old + 1]))
            if lo < hi:
                pos = self._positions(old)[lo - int(starts[old]) : hi - int(starts[old])]
                parts.append(np.stack([np.full(len(pos), old, dtype=np.int64), pos], axis=1))
        return np.concatenate(parts) if parts else np.empty((0, 2), np.int64)

    @property
    def items(self) -> np.ndarray:
        """Every remaining item (all old slots replayed): for the counts of a report."""
        parts = [
            np.stack([np.full(n, old, dtype=np.int64), self._positions(old)], axis=1) for old, n in enumerate(self.remaining)
        ]
        return np.concatenate(parts) if parts else np.empty((0, 2), np.int64)


def elastic_plan(
    length: int,
    seed: int,
    epoch: int,
    k: int,
    shuffle_buffer: int,
    batch_size: int,
    origin: tuple[int, int, int],
    slots: int,
) -> ElasticPlan:
    """See :class:`ElasticPlan`; ``origin`` is (old world size, old workers, batches per rank),
    ``length`` the samples per slot of the old world's plan."""
    old_world, old_workers, batches = origin
    nw = max(1, old_workers)
    w = np.tile(np.arange(nw, dtype=np.int64), old_world)
    done = np.maximum(0, (batches - w + nw - 1) // nw)
    remaining = length * k - done * batch_size
    return ElasticPlan(seed, epoch, k, shuffle_buffer, batch_size, origin, slots, remaining, length)


class ChunkStream:
    """A new slot's run of an :class:`ElasticPlan`: the same interface as :class:`TrainStream`
    (positions ``0 .. per_slot-1``), its patches cut through the old slots' streams."""

    def __init__(self, streams: dict[int, TrainStream], chunk: np.ndarray, k: int) -> None:
        self.streams, self.k = streams, k
        self.chunk = chunk
        self.total = len(chunk)
        self._waiting: dict[tuple[int, int], list[int]] = {}
        self._ready: dict[int, Patch] = {}
        # groups of consecutive items with one (old slot, sample): where each starts
        key = chunk[:, 0] * (1 << 40) + chunk[:, 1] // k if len(chunk) else np.empty(0, np.int64)
        self._starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(chunk) else np.empty(0, np.int64)

    def _group(self, g: int, first: int | None = None) -> tuple[int, int, list[int], list[int]]:
        a = int(self._starts[g])
        b = int(self._starts[g + 1]) if g + 1 < len(self._starts) else self.total
        a = max(a, first) if first is not None else a
        slot, i = int(self.chunk[a, 0]), int(self.chunk[a, 1]) // self.k
        return slot, i, [int(p) % self.k for p in self.chunk[a:b, 1]], list(range(a, b))

    def patches(self, start: int = 0) -> Iterator[Patch]:
        if start >= self.total:
            return
        g = int(np.searchsorted(self._starts, start, side="right")) - 1
        for n in range(g, len(self._starts)):
            slot, i, js, _ = self._group(n, start if n == g else None)
            yield from self.streams[slot].cut_positions(i, js)

    def wait_for(self, positions: tuple[int, ...]) -> None:
        for pos in positions:
            slot, p = int(self.chunk[pos, 0]), int(self.chunk[pos, 1])
            self._waiting.setdefault((slot, p // self.k), []).append(pos)

    def resolve(self, pos: int) -> Patch:
        if pos in self._ready:
            return self._ready.pop(pos)
        slot, p = int(self.chunk[pos, 0]), int(self.chunk[pos, 1])
        mine = sorted(self._waiting.pop((slot, p // self.k)))
        js = [int(self.chunk[q, 1]) % self.k for q in mine]
        for q, patch in zip(mine, self.streams[slot].cut_positions(p // self.k, js), strict=True):
            self._ready[q] = patch
        return self._ready.pop(pos)
