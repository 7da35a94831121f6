"""Decoded pairs in plan order, from the shards or the node-wide decoded cache, and the one policy
for bad samples (``on_error``)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Generator, Iterable
from typing import Any

from shardmaker.errors import OnError
from shardmaker.format import Manifest, hr_member
from wdsr.errors import SampleError
from wdsr.pipeline.checks import Kind, Verify
from wdsr.pipeline.clips import ClipConfig
from wdsr.pipeline.decode import decode_sample
from wdsr.pipeline.kinds import wanted_members
from wdsr.pipeline.patches import Pair
from wdsr.pipeline.plan import Span
from wdsr.pipeline.read import ShardReader
from wdsr.pipeline.sample import DecodeSpec, LrMode
from wdsr.pipeline.stats import SharedStats
from wdsr.pipeline.whole import DecodedPair
from wdsr.store.decoded import DecodedCache

log = logging.getLogger("wdsr")


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
    cache: DecodedCache | None = None  # node-wide decoded pairs (wdsr.store.decoded)
    kind: Kind | None = None  # what every sample decodes to (one object for all sources of a mix)
    clip: ClipConfig | None = None  # a clip dataset's windows (its samples are clip segments)
    lr: LrMode = LrMode.STORED  # or LR made from HR: per patch (pipeline.bicubic), on the device (pipeline.degraded)
    degrade: Any = None  # a wdsr.degrade config (lr DEGRADE): HR patches + their parameters

    def shard_name(self, index: int) -> str:
        return self.reader.manifest.shards[index].name

    def pairs(self, spans: Iterable[Span], worker: int, count: bool = True) -> Generator[Pair | None, None, None]:
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
                    w, h = info.hr_sizes[i]
                    hit = self.cache.lookup(info.keys[i], (int(w), int(h)), *self._cache_kind())
                    if hit is not None:
                        self.stats.add(worker, samples=1, decoded_hits=1)
                        yield DecodedPair(info.name, info.keys[i], span.rep, hit[0], hit[1], 0, 0, chw=True)
                        i += 1
                        continue
                    if rejected := self.cache.take_rejected():  # not what the manifest says, or corrupt
                        self.stats.add(worker, decoded_rejected=rejected)
                    j = i + 1  # there but unusable (refused, or being removed): decode this one (and replace it)
                else:
                    j = i + 1
                    while j < span.stop and not self.cache.has(info.keys[j]):
                        j += 1
                    for gone in range(i, j):  # not (or no longer) there: a mapping this process kept goes too
                        self.cache.forget(info.keys[gone])
                yield from self._decoded(Span(span.shard_index, i, j, span.rep), worker, count)
                i = j

    def _cache_kind(self) -> tuple[int | None, int | None]:
        """Channels and bit depth a decoded-cache entry must have (None: not known yet): the
        dataset's (or mix's) kind, recorded or fixed by a decoded sample, never by a cache entry."""
        if self.kind is not None:
            return self.kind.channels, self.kind.bit_depth
        return self.reader.manifest.channels, self.reader.manifest.bit_depth

    def _decoded(self, span: Span, worker: int, count: bool) -> Generator[Pair | None, None, None]:
        manifest = self.reader.manifest
        lr = LrMode(self.lr)
        wanted = wanted_members(manifest, self.scale, lr)
        names = manifest.member_names(self.scale) if not lr.made else (_hr_name(manifest), "")
        spec = DecodeSpec(names, self.scale, self.verify, self.max_pixels, self.kind, self.clip, lr, self.degrade)
        pos = span.start
        while pos < span.stop:
            try:
                for raw in self.reader.span(Span(span.shard_index, pos, span.stop, span.rep), wanted):
                    pos = raw.index + 1
                    self.stats.add(worker, samples=1, bytes_read=raw.nbytes, read_ns=raw.read_ns, **self.reader.take_counts())
                    try:
                        pair = decode_sample(raw, spec)
                    except SampleError as exc:
                        if count:
                            self.errors(worker, exc)
                        elif self.errors.on_error is OnError.FAIL:
                            raise
                        yield None
                        continue
                    self.stats.add(worker, decode_ns=pair.decode_ns, verify_ns=pair.verify_ns)
                    # a whole pair is kept, a clip keeps its frames; a tiled pair (decoded tile by tile) is not
                    if self.cache is not None and pair.keep(self.cache, *self._cache_kind()):
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


def _hr_name(m: Manifest) -> str:
    return m.members.hr if m.members is not None else hr_member(m.codec)


class MixSource:
    """Several datasets' sources behind one numbering of their shards (one source after the other)."""

    def __init__(self, sources: list[Source]) -> None:
        self.sources = sources
        self.errors, self.stats = sources[0].errors, sources[0].stats  # shared by all: one dataset's
        self._where = [(i, local) for i, s in enumerate(sources) for local in range(len(s.reader.manifest.shards))]

    def shard_name(self, index: int) -> str:
        i, local = self._where[index]
        return self.sources[i].shard_name(local)

    def pairs(self, spans: Iterable[Span], worker: int, count: bool = True) -> Generator[Pair | None, None, None]:
        for span in spans:
            i, local = self._where[span.shard_index]
            yield from self.sources[i].pairs([Span(local, span.start, span.stop, span.rep)], worker, count)
