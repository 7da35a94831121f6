"""One worker's training epoch as stages: plan -> read -> decode -> patches (with stand-ins) ->
shuffle -> batch, each addressed by position so the epoch can resume anywhere.

A worker's slot holds ``L`` samples; its patch stream has ``L x k`` positions, position
``i * k + j`` being patch ``j`` of slot sample ``i``. What sits at a position is a pure function
of the plan and the data: patch ``rep * k + j`` of sample ``i`` when it is usable; when it is not
(``on_error="skip"``), a stand-in cut from the next usable sample of the slot (else the last one
before it, else the first usable one of the other slots), with a patch index that only the
distance between the two samples decides. The shuffle buffer's random draws never look at the
patches (``wdsr.shuffle``), so after ``n`` batches the positions still waiting in the buffer are
recomputed from ``n`` alone, and a resumed worker decodes only the samples that still owe
patches: nothing consumed is read again (stand-ins aside, which may read a neighbour).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from shardmaker.errors import OnError
from wdsr.decode import DecodedPair, Verify, decode_pair, wanted_members
from wdsr.decoded import DecodedCache
from wdsr.errors import SampleError
from wdsr.handoff import BatchPool, SlotRef, write_rows
from wdsr.patches import Patch, PatchConfig, cut_patches
from wdsr.plan import SampleRef, Span, TrainPlan
from wdsr.read import ShardReader
from wdsr.shuffle import fast_forward, shuffled
from wdsr.stats import SharedStats

log = logging.getLogger("wdsr")

_EXTRA_J = 1 << 32  # patch indices of stand-ins: never those of a sample's own patches
_BACKWARD = 1 << 30  # stand-ins cut from a sample before the failed one
_FALLBACK = 1 << 31  # stand-ins cut from another slot's sample (every sample of the slot failed)


class ErrorPolicy:
    """The one place that decides what a bad sample does: raise it (``fail``), or count it, log
    it once per process and go on (``skip``)."""

    def __init__(self, on_error: OnError, stats: SharedStats) -> None:
        self.on_error, self.stats = on_error, stats
        self._logged: set[tuple[str, str | None]] = set()

    def __call__(self, worker: int, err: SampleError, samples: int = 1) -> None:
        if self.on_error is OnError.FAIL:
            raise err
        self.stats.add(worker, skipped=samples)
        if (err.shard, err.key) not in self._logged:
            self._logged.add((err.shard, err.key))
            log.warning("skipping %s (%d sample(s))", err, samples)


@dataclasses.dataclass(frozen=True)
class Source:
    """Where to read and how to decode: shared by every stream of a dataset."""

    reader: ShardReader
    scale: int
    verify: Verify
    max_pixels: int
    stats: SharedStats
    errors: ErrorPolicy
    cache: DecodedCache | None = None  # node-wide decoded pairs (wdsr.decoded)

    def shard_name(self, index: int) -> str:
        return self.reader.manifest.shards[index].name

    def pairs(self, spans: Iterable[Span], worker: int, count: bool = True) -> Generator[DecodedPair | None, None, None]:
        """One item per sample of ``spans``, in order: the decoded pair, or None for a sample that
        cannot be used. Its error has gone to the policy already (which raises it under ``fail``;
        ``count=False``, for look-aheads, leaves the counting to the pass that reaches it). With a
        decoded cache, cached samples are mapped from it; runs of the others are read and decoded."""
        if self.cache is None:
            for span in spans:
                yield from self._decoded(span, worker, count)
            return
        for span in spans:
            info = self.reader.manifest.shards[span.shard_index]
            i = span.start
            while i < span.stop:
                if self.cache.has(info.keys[i]):
                    hit = self.cache.lookup(info.keys[i])
                    if hit is not None:
                        self.stats.add(worker, samples=1, decoded_hits=1)
                        yield DecodedPair(info.name, info.keys[i], span.rep, hit[0], hit[1], 0, 0, chw=True)
                        i += 1
                        continue
                    j = i + 1  # there but unreadable (being removed?): decode this one
                else:
                    j = i + 1
                    while j < span.stop and not self.cache.has(info.keys[j]):
                        j += 1
                    for gone in range(i, j):  # not (or no longer) there: a mapping this process kept goes too
                        self.cache.forget(info.keys[gone])
                yield from self._decoded(Span(span.shard_index, i, j, span.rep), worker, count)
                i = j

    def _decoded(self, span: Span, worker: int, count: bool) -> Generator[DecodedPair | None, None, None]:
        manifest = self.reader.manifest
        wanted, names = wanted_members(manifest, self.scale), manifest.member_names(self.scale)
        pos = span.start
        while pos < span.stop:
            try:
                for raw in self.reader.span(Span(span.shard_index, pos, span.stop, span.rep), wanted):
                    pos = raw.index + 1
                    self.stats.add(worker, samples=1, bytes_read=raw.nbytes, read_ns=raw.read_ns, **self.reader.take_counts())
                    try:
                        pair = decode_pair(raw, names, self.scale, self.verify, self.max_pixels)
                    except SampleError as exc:
                        if count:
                            self.errors(worker, exc)
                        elif self.errors.on_error is OnError.FAIL:
                            raise
                        yield None
                        continue
                    self.stats.add(worker, decode_ns=pair.decode_ns, verify_ns=pair.verify_ns)
                    if self.cache is not None and self.cache.store(pair.key, pair.hr, pair.lr):
                        self.stats.add(worker, decoded_stores=1)
                    yield pair
                    del pair, raw  # hold nothing while the next sample is read and decoded
            except SampleError as exc:
                self.stats.add(worker, **self.reader.take_counts())
                lost = span.stop - pos if exc.key is None else 1
                if count:
                    self.errors(worker, exc, lost)
                elif self.errors.on_error is OnError.FAIL:
                    raise
                for _ in range(lost):
                    yield None
                pos += lost


class MixSource:
    """Several datasets' sources behind one numbering of their shards (one source after the other)."""

    def __init__(self, sources: list[Source]) -> None:
        self.sources = sources
        self.errors, self.stats = sources[0].errors, sources[0].stats  # shared by all: one dataset's
        self._where = [(i, local) for i, s in enumerate(sources) for local in range(len(s.reader.manifest.shards))]

    def shard_name(self, index: int) -> str:
        i, local = self._where[index]
        return self.sources[i].shard_name(local)

    def pairs(self, spans: Iterable[Span], worker: int, count: bool = True) -> Generator[DecodedPair | None, None, None]:
        for span in spans:
            i, local = self._where[span.shard_index]
            yield from self.sources[i].pairs([Span(local, span.start, span.stop, span.rep)], worker, count)


class TrainStream:
    """The patches of one worker slot for one epoch, by position (see the module docstring)."""

    def __init__(
        self,
        source: Source | MixSource,
        spec: PatchConfig,
        k: int,
        seed: int,
        epoch: int,
        plan: TrainPlan,
        slot: int,
        worker: int,
    ) -> None:
        self.src, self.spec, self.k, self.seed, self.epoch, self.worker = source, spec, k, seed, epoch, worker
        self.samples = [SampleRef(sp.shard_index, i, sp.rep) for sp in plan[slot] for i in range(sp.start, sp.stop)]
        self.plan, self.slot = plan, slot
        self.total = len(self.samples) * k
        self._waiting: dict[int, list[int]] = {}  # sample -> its waiting js, at a resume
        self._ready: dict[int, Patch] = {}  # position -> patch, cut early for a waiting position

    # ---- reading samples by slot index --------------------------------------------------------
    def _spans(self, i0: int, i1: int) -> list[Span]:
        out: list[Span] = []
        for shard, index, rep in self.samples[i0:i1]:
            last = out[-1] if out else None
            if last is not None and (last.shard_index, last.stop, last.rep) == (shard, index, rep):
                out[-1] = Span(shard, last.start, index + 1, rep)
            else:
                out.append(Span(shard, index, index + 1, rep))
        return out

    def _usable(self, item: DecodedPair | None, count: bool = True) -> DecodedPair | None:
        """The pair if patches can be cut from it; a pair too small for one patch is a bad sample."""
        if item is None:
            return None
        p = self.spec.patch_size // self.spec.scale
        lh, lw = item.lr_hw
        if lh < p or lw < p:
            err = SampleError(item.shard, item.key, f"LR {lw}x{lh} is smaller than the LR patch {p}x{p}")
            if count or self.src.errors.on_error is OnError.FAIL:
                self.src.errors(self.worker, err)
            return None
        return item

    def _one(self, i: int, count: bool = False) -> DecodedPair | None:
        """Slot sample ``i`` alone (a look-ahead or a resume): counted as a skip only when ``count``."""
        items = self.src.pairs(self._spans(i, i + 1), self.worker, count)
        try:
            return self._usable(next(items), count)
        finally:
            items.close()

    # ---- patches ---------------------------------------------------------------------------
    def _cut(self, pair: DecodedPair, indices: list[int]) -> list[Patch]:
        t0 = time.perf_counter_ns()
        out: list[Patch] = []
        rejected = 0
        run = 0
        for n, j in enumerate(indices):  # runs of consecutive indices in one call (patch j is the same either way)
            if n + 1 == len(indices) or indices[n + 1] != j + 1:
                got, r = cut_patches(pair, self.spec, self.seed, self.epoch, j - run, run + 1)
                out += got
                rejected += r
                run = 0
            else:
                run += 1
        self.src.stats.add(self.worker, patches=len(out), rejected=rejected, patch_ns=time.perf_counter_ns() - t0)
        return out

    def _own(self, pair: DecodedPair, i: int, js: list[int]) -> list[Patch]:
        rep = self.samples[i].rep
        return self._cut(pair, [rep * self.k + j for j in js])

    def _stand_ins(self, pair: DecodedPair, good: int | None, bad: int, js: list[int]) -> list[Patch]:
        """Patches for the positions ``js`` of failed sample ``bad``, cut from ``pair`` (slot
        sample ``good``, or another slot's when None)."""
        k = self.k
        if good is None:
            base = _EXTRA_J + _FALLBACK + bad * k
        elif good > bad:
            base = _EXTRA_J + (good - bad - 1) * k
        else:
            base = _EXTRA_J + _BACKWARD + (bad - good - 1) * k
        return self._cut(pair, [base + j for j in js])

    def _backup(self, bad: int, last_good: int | None) -> tuple[DecodedPair, int | None]:
        """The source of stand-ins for a failed sample with no usable one after it in the slot."""
        i = bad - 1 if last_good is None else last_good
        while i >= 0:
            pair = self._one(i)
            if pair is not None:
                return pair, i
            i -= 1
        items = self.src.pairs(self.plan.others(self.slot), self.worker, count=False)
        try:
            for item in items:
                pair = self._usable(item, count=False)
                if pair is not None:
                    return pair, None
        finally:
            items.close()
        shard = self.src.shard_name(self.samples[0].shard_index) if self.samples else "(no shard)"
        raise SampleError(shard, None, "no sample of the dataset could be read; nothing to train on")

    def patches(self, start: int = 0) -> Iterator[Patch]:
        """The patches at positions ``start ..`` in order (a stand-in right where its failed sample was)."""
        i0, j0 = divmod(start, self.k)
        owed: list[tuple[int, list[int]]] = []  # failed samples waiting for the next usable one
        last_good: int | None = None
        items = self.src.pairs(self._spans(i0, len(self.samples)), self.worker)
        for i, item in enumerate(items, start=i0):
            js = list(range(j0 if i == i0 else 0, self.k))
            pair = self._usable(item)
            del item
            if pair is None:
                owed.append((i, js))
                continue
            for bad, bjs in owed:
                yield from self._stand_ins(pair, i, bad, bjs)
            owed = []
            yield from self._own(pair, i, js)
            last_good = i
            self.src.stats.mark_rss(self.worker)
            del pair  # the decoded pair goes before the next one is made
        if owed:
            pair, good = self._backup(owed[0][0], last_good)
            for bad, bjs in owed:
                yield from self._stand_ins(pair, good, bad, bjs)

    # ---- resuming --------------------------------------------------------------------------
    def wait_for(self, positions: tuple[int, ...]) -> None:
        """Positions that were waiting in the shuffle buffer at the resume point."""
        for pos in positions:
            i, j = divmod(pos, self.k)
            self._waiting.setdefault(i, []).append(j)

    def resolve(self, pos: int) -> Patch:
        """The patch of a waiting position: the first time one of a sample's waiting positions is
        asked for, that sample is decoded once and all its waiting positions are cut."""
        if pos in self._ready:
            return self._ready.pop(pos)
        i = pos // self.k
        js = sorted(self._waiting.pop(i))
        for j, patch in zip(js, self.cut_positions(i, js), strict=True):
            self._ready[i * self.k + j] = patch
        return self._ready.pop(pos)

    def cut_positions(self, i: int, js: list[int]) -> list[Patch]:
        """The patches at positions ``(i, j) for j in js`` on their own: sample ``i`` decoded once,
        or, if it is not usable, the stand-ins the stream puts there."""
        pair = self._one(i, count=True)
        if pair is not None:
            return self._own(pair, i, js)
        source: tuple[DecodedPair, int | None] | None = None
        for g in range(i + 1, len(self.samples)):
            nxt = self._one(g)
            if nxt is not None:
                source = (nxt, g)
                break
        if source is None:
            source = self._backup(i, None)
        return self._stand_ins(source[0], source[1], i, js)


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
        rng = np.random.default_rng([self.seed, self.epoch, r, w, 0x5348])
        at = fast_forward(self.shuffle_buffer, rng, total, done * self.batch_size)
        waiting = np.array(at.buffer if at.tail is None else at.tail, dtype=np.int64)
        rest = np.arange(at.next_input, total, dtype=np.int64) if at.tail is None else np.empty(0, np.int64)
        return np.sort(np.concatenate([waiting, rest]))

    def chunk(self, slot: int) -> np.ndarray:
        """``[per_slot, 2]`` (old slot, position) items of new slot ``slot``."""
        begin, end = slot * self.per_slot, (slot + 1) * self.per_slot
        starts = np.concatenate([[0], np.cumsum(self.remaining)])
        parts = []
        for old in range(len(self.remaining)):
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
    done = np.array([max(0, (batches - w + nw - 1) // nw) for _ in range(old_world) for w in range(nw)], dtype=np.int64)
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
    in_worker = torch.utils.data.get_worker_info() is not None
    t0 = time.perf_counter_ns()
    batch: list[Patch] = []
    for patch in patches:
        batch.append(patch)
        if len(batch) == batch_size:
            t1 = time.perf_counter_ns()
            keys = [p.key for p in batch] if return_keys else None
            out: SlotRef | tuple[Any, ...] | None = None
            if pool is not None and in_worker:
                out = pool.put_patches(worker, batch, keys)
            if out is None:
                out = collate(batch, return_keys)
            batch = []
            t2 = time.perf_counter_ns()
            stats.add(worker, batches=1, busy_ns=t2 - t0, patch_ns=t2 - t1)  # patch_ns: each patch's cut and its write
            yield out
            t0 = time.perf_counter_ns()


def collate(patches: Sequence[Patch], return_keys: bool = False) -> tuple[Any, ...]:
    """Patches into new ``lr [B,C,p,p]``, ``hr [B,C,sp,sp]`` tensors (where no slot pool is)."""
    first = patches[0]
    lr = np.empty((len(patches),) + first.lr_shape, dtype=first.dtype)
    hr = np.empty((len(patches),) + first.hr_shape, dtype=first.dtype)
    write_rows(patches, lr, hr)
    out = (torch.from_numpy(lr), torch.from_numpy(hr))
    return (*out, [p.key for p in patches]) if return_keys else out
