"""One worker's training epoch as stages: plan -> read -> decode -> patches (with stand-ins) ->
shuffle -> batch, each addressed by position so the epoch can resume anywhere.

A worker's slot holds ``L`` samples; its patch stream has ``L x k`` positions, position
``i * k + j`` being patch ``j`` of slot sample ``i``. What sits at a position is a pure function
of the plan and the data: patch ``rep * k + j`` of sample ``i`` when it is usable; when it is not
(``on_error="skip"``), a stand-in cut from the next usable sample of the slot (else the last one
before it, else the first usable one of the other slots), with a patch index that only the
distance between the two samples decides. The shuffle buffer's random draws never look at the
patches (``wdsr.pipeline.shuffle``), so after ``n`` batches the positions still waiting in the buffer are
recomputed from ``n`` alone, and a resumed worker decodes only the samples that still owe
patches: nothing consumed is read again (stand-ins aside, which may read a neighbour).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from shardmaker.errors import OnError
from wdsr.errors import SampleError
from wdsr.pipeline.patches import Pair, Patch, PatchConfig, cut_patches
from wdsr.pipeline.plan import SampleRef, Span, TrainPlan
from wdsr.pipeline.source import MixSource, Source

_EXTRA_J = 1 << 32  # patch indices of stand-ins: never those of a sample's own patches
_BACKWARD = 1 << 30  # stand-ins cut from a sample before the failed one
_FALLBACK = 1 << 31  # stand-ins cut from another slot's sample (every sample of the slot failed)


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
        self._kept: tuple[Pair, dict[int, Patch], int] | None = None  # a lazy pair's patches, cut to check it

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

    def _usable(self, item: Pair | None, count: bool = True) -> Pair | None:
        """The pair if patches can be cut from it; a pair too small for one patch is a bad sample,
        and so is a tiled pair a tile of whose own ``k`` patches (all of them, wherever the stream
        starts: a pure function of the data) fails its checks as it is decoded, or a clip segment a
        frame of whose ``k`` windows does."""
        if item is None:
            return None
        p = self.spec.patch_size // self.spec.scale
        lh, lw = item.lr_hw
        err = None
        if lh < p or lw < p:
            err = SampleError(item.shard, item.key, f"LR {lw}x{lh} is smaller than the LR patch {p}x{p}")
        elif item.lazy:  # decodes (and keeps) the tiles or frames its patches or
            # windows touch, so a bad one is found here, where the policy decides; the cut then only copies
            t0 = time.perf_counter_ns()
            try:
                got, rejected = cut_patches(item, self.spec, self.seed, self.epoch, item.rep * self.k, self.k)
                # kept for the own positions' cut that follows: the same patches, not cut (copied) twice
                self._kept = (item, dict(zip(range(item.rep * self.k, (item.rep + 1) * self.k), got, strict=True)), rejected)
            except SampleError as exc:
                err = exc
            self.src.stats.add(self.worker, patch_ns=time.perf_counter_ns() - t0, **item.take_stats())
        if err is None:
            return item
        if count or self.src.errors.on_error is OnError.FAIL:
            self.src.errors(self.worker, err)
        return None

    def _one(self, i: int, count: bool = False) -> Pair | None:
        """Slot sample ``i`` alone (a look-ahead or a resume): counted as a skip only when ``count``."""
        items = self.src.pairs(self._spans(i, i + 1), self.worker, count)
        try:
            return self._usable(next(items), count)
        finally:
            items.close()

    # ---- patches ---------------------------------------------------------------------------
    def _cut(self, pair: Pair, indices: list[int]) -> list[Patch]:
        t0 = time.perf_counter_ns()
        kept = self._kept
        if kept is not None and kept[0] is not pair:
            kept = self._kept = None  # another pair's: dropped
        if kept is not None and all(j in kept[1] for j in indices):  # the own positions, cut by _usable already
            self._kept = None
            again = [kept[1][j] for j in indices]
            rejected = kept[2] if len(again) == len(kept[1]) else 0
            self.src.stats.add(self.worker, patches=len(again), rejected=rejected, patch_ns=time.perf_counter_ns() - t0)
            return again
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
        reads = pair.take_stats()  # a tiled pair's tiles are read as its patches are cut, a clip's frames cached
        self.src.stats.add(self.worker, patches=len(out), rejected=rejected, patch_ns=time.perf_counter_ns() - t0, **reads)
        return out

    def _own(self, pair: Pair, i: int, js: list[int]) -> list[Patch]:
        rep = self.samples[i].rep
        return self._cut(pair, [rep * self.k + j for j in js])

    def _stand_ins(self, pair: Pair, good: int | None, bad: int, js: list[int]) -> list[Patch]:
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

    def _backup(self, bad: int, last_good: int | None) -> tuple[Pair, int | None]:
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
        source: tuple[Pair, int | None] | None = None
        for g in range(i + 1, len(self.samples)):
            nxt = self._one(g)
            if nxt is not None:
                source = (nxt, g)
                break
        if source is None:
            source = self._backup(i, None)
        return self._stand_ins(source[0], source[1], i, js)
