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
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from shardmaker.errors import brief
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


MAX_EPOCH_SAMPLES = 1 << 40  # samples per epoch of a mix: far beyond any real epoch, and exact in int64 and float
MAX_MIX_SEGMENTS = 1 << 20  # rows of a mix's epoch layout (32 bytes each): what its memory grows with


def _mix_passes(sizes: Sequence[int], want: int) -> tuple[int, int]:
    """``(full passes, samples of the last partial pass)`` of a source of shard ``sizes`` giving ``want``."""
    total = sum(int(n) for n in sizes)
    return divmod(int(want), total) if total else (0, 0)


def mix_segment_count(sources: Sequence[Sequence[int]], counts: Sequence[int]) -> int:
    """The most rows :func:`mix_segments` lays out (counted, not made): a source gives one row per
    shard per pass over it, so the count grows with ``counts[i]`` / the samples per shard of source ``i``."""
    rows = 0
    for sizes, want in zip(sources, counts, strict=True):
        full, rest = _mix_passes(sizes, want)
        rows += (full + (1 if rest else 0)) * sum(1 for n in sizes if n > 0)
    return rows


def check_mix_segments(sources: Sequence[Sequence[int]], counts: Sequence[int]) -> None:
    """A mix whose epoch would lay out more than :data:`MAX_MIX_SEGMENTS` rows is refused (before any is made)."""
    rows = mix_segment_count(sources, counts)
    if rows > MAX_MIX_SEGMENTS:
        raise ValueError(
            f"epoch_samples={sum(counts)} repeats the datasets' {sum(len(s) for s in sources)} shards into {rows} "
            f"shard segments per epoch, over the limit of {MAX_MIX_SEGMENTS} (the epoch's layout is held in memory): "
            "lower epoch_samples, or use fewer, larger shards"
        )


def mix_segments(sources: Sequence[Sequence[int]], counts: Sequence[int], seed: int, epoch: int) -> np.ndarray:
    """The layout of a mix: source ``i`` (its shard sizes, numbered after the previous sources'
    shards) gives ``counts[i]`` samples this epoch, from its own (seed, epoch) shard order, wrapping
    around (with the next ``rep``) when it gives more than it has; then every source's segments are
    permuted together by (seed, epoch), so sources mix at shard granularity. At most
    :data:`MAX_MIX_SEGMENTS` rows (a ValueError beyond)."""
    check_mix_segments(sources, counts)
    blocks = []
    base = 0
    for i, (sizes, want) in enumerate(zip(sources, counts, strict=True)):
        sz = np.asarray(sizes, dtype=np.int64)
        order = seeds.mix_source_order(seed, epoch, i).permutation(len(sz))
        order = order[sz[order] > 0]
        full, rest = _mix_passes(sizes, want)
        n = len(order)
        if full:  # whole passes: every shard of the order, pass after pass
            reps = np.repeat(np.arange(full, dtype=np.int64), n)
            shards = np.tile(order, full)
            blocks.append(np.stack([base + shards, np.zeros_like(shards), sz[shards], reps], axis=1))
        if rest:  # the last pass: the shards of the order until ``rest`` samples, the last one cut
            ends = np.cumsum(sz[order])
            k = int(np.searchsorted(ends, rest, side="left")) + 1
            takes = sz[order[:k]].copy()
            takes[-1] -= int(ends[k - 1]) - rest
            part = order[:k]
            blocks.append(np.stack([base + part, np.zeros_like(part), takes, np.full_like(part, full)], axis=1))
        base += len(sz)
    seg = np.concatenate(blocks).astype(np.int64, copy=False) if blocks else np.zeros((0, 4), dtype=np.int64)
    return seg[seeds.mix_segment_order(seed, epoch).permutation(len(seg))]


def _real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _as_float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond any float
        return math.inf


def _mix_weights(samples: Sequence[int], weights: object) -> list[float]:
    """``weights`` checked: one finite, non-negative real number (int or float) per source, a finite
    positive sum, and none for a source without samples."""
    if isinstance(weights, (str, bytes, dict, set, frozenset)) or not hasattr(weights, "__len__"):
        raise ValueError(f"weights must be a list of numbers, one per dataset, got {brief(weights)}")
    if len(weights) != len(samples):  # type: ignore[arg-type]
        raise ValueError(f"weights must be one number per dataset ({len(samples)}), got {brief(weights)}")
    ws = list(weights)  # type: ignore[call-overload]
    if not all(_real(w) and w >= 0 and math.isfinite(_as_float(w)) for w in ws):
        raise ValueError(f"weights must be finite non-negative numbers (int or float), got {brief(weights)}")
    if not 0 < sum(_as_float(w) for w in ws) < math.inf:
        raise ValueError(f"weights must have a finite sum above 0, got {brief(weights)}")
    for w, n in zip(ws, samples, strict=True):
        if w > 0 and n < 1:
            raise ValueError(f"weights: a dataset without samples has weight {brief(w)}, got {brief(weights)}")
    return [_as_float(w) for w in ws]


def check_epoch_samples(epoch_samples: object) -> int:
    """``epoch_samples`` checked: an int (not a bool) in ``[1, MAX_EPOCH_SAMPLES]``."""
    if not isinstance(epoch_samples, (int, np.integer)) or isinstance(epoch_samples, (bool, np.bool_)):
        raise ValueError(f"epoch_samples must be an int, got {brief(epoch_samples)}")
    if not 1 <= epoch_samples <= MAX_EPOCH_SAMPLES:
        raise ValueError(f"epoch_samples must be in [1, {MAX_EPOCH_SAMPLES}], got {brief(epoch_samples)}")
    return int(epoch_samples)


def mix_counts(samples: Sequence[int], weights: Sequence[float] | None, total: int | None = None) -> list[int]:
    """Samples each source gives per epoch: all of each without weights and ``total``; else the
    largest-remainder shares of ``total`` (default: the union's size) by weight (without weights: by
    size), computed exactly (in fractions, so the counts always add up to ``total``)."""
    if total is not None:
        total = check_epoch_samples(total)
    if weights is None:
        if total is None:
            return [int(n) for n in samples]
        weights = [float(n) for n in samples]
    ws = [Fraction(repr(w)) for w in _mix_weights(samples, weights)]  # 0.1 as the decimal written, exactly
    total = sum(int(n) for n in samples) if total is None else total
    whole = sum(ws)
    exact = [total * w / whole for w in ws]
    out = [math.floor(x) for x in exact]
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
