"""Read samples of a shard span through fsspec, starting at the manifest offsets.

One read per sample (``offsets[i]`` .. ``offsets[i+1]``), members parsed with our small tar
reader and grouped by key; only the members asked for are kept. Local shards are read in place;
remote ones with resilient range requests (read ahead by a thread) or from a node-local cache.
Tiled members are read by range: in place (local), or for a remote tiled sample over
``ReadConfig.ranged_tiles_over`` bytes, its tar headers, json and tile indexes now and the tiles
as the patches ask for them (``remote.RemoteRange``).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import io
import os
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec

from shardmaker import deprecation, storage
from shardmaker import format as fmt
from shardmaker.errors import InputError
from shardmaker.format import Manifest, ShardInfo
from wdsr.errors import SampleError, SampleUnavailable
from wdsr.pipeline.infiles import RootOpener, file_span
from wdsr.pipeline.plan import Span
from wdsr.store import remote
from wdsr.store.cache import CacheMismatch, ShardCache
from wdsr.store.remote import Retry

_INHERITED: list[Any] = []
_FILL_CHUNK = 32 << 20  # bytes per range read when filling the cache
_VIEW_MIN = 1 << 20  # reads at least this large come back as views (members: images); smaller as bytes
_HEAD_READ = 64 << 10  # a remote tiled sample's tar walk reads this much at a time: a header, its json, a tile index
_TILE_THREADS = 4  # concurrent range requests for the tiles of one sample's patches


@dataclasses.dataclass
class RawSample:
    shard: str
    key: str
    index: int  # sample index inside the shard
    rep: int  # wrap-around count from the plan (0 = first pass)
    members: dict[str, Any]  # suffix ("json", "hr.png", ...) -> bytes or a view; a tiled member: FileMember, RangePart or bytes
    nbytes: int
    read_ns: int
    hr_size: tuple[int, int] | None = None  # (w, h) the manifest promises for HR
    digests: dict[str, int] | None = None  # an index of foreign shards: the members' xxh3_64 from the manifest


class Fetch(str, enum.Enum):
    """How remote shards are read (local ones are always read in place)."""

    RANGES = "ranges"  # one resilient range GET per sample, the next ones fetched ahead by a thread
    FSSPEC = "fsspec"  # an fsspec file object and its read-ahead block cache (for comparison)


@dataclasses.dataclass(frozen=True)
class ReadConfig:
    retry: Retry = Retry()
    read_ahead: int = 1  # samples fetched ahead of the one being decoded (remote, Fetch.RANGES)
    fetch: Fetch = Fetch.RANGES
    cache_dir: str | None = None  # node-local shard cache for remote datasets
    cache_limit: int | None = None  # bytes; least recently used shards are evicted beyond it
    block_size: int = 16 << 20  # Fetch.FSSPEC block size
    # a remote tiled sample over this many bytes is read by the tiles its patches touch (None: whole, always)
    ranged_tiles_over: int | None = 4 << 20

    def __post_init__(self) -> None:
        object.__setattr__(self, "fetch", Fetch(self.fetch))
        if self.read_ahead < 0:
            raise ValueError(f"read_ahead must be >= 0, got {self.read_ahead}")
        if self.ranged_tiles_over is not None and self.ranged_tiles_over < 0:
            raise ValueError(f"ranged_tiles_over must be >= 0 or None, got {self.ranged_tiles_over}")


class ShardReader:
    """Opens shards of one dataset; the filesystem is made lazily, in the worker that reads.

    Local shards are read in place. Remote ones (S3, GCS, ...) are read sample by sample with
    range requests that retry and resume (:mod:`wdsr.store.remote`), or from the node-local cache.
    ``counts`` holds this process's retries and cache hits/misses until the dataset takes them.
    """

    def __init__(
        self, url: str, manifest: Manifest, storage_options: dict[str, Any] | None = None, options: ReadConfig | None = None
    ) -> None:
        self.url, self.manifest = url, manifest
        self.options = options or ReadConfig()
        self.storage_options = dict(storage_options or {})
        self.cache = ShardCache(self.options.cache_dir, self.options.cache_limit) if self.options.cache_dir else None
        self.counts: Counter[str] = Counter()
        self._probed: set[tuple] = set()  # local shard files whose probe matched (path, inode, mtime, size)
        self._fs = None
        self._root = ""
        self._pid = 0
        self._pool: ThreadPoolExecutor | None = None
        self._tile_pool: ThreadPoolExecutor | None = None
        self._lock: threading.Lock | None = None
        self._roots: RootOpener | None = None  # an index of files: its roots, opened in the reading process

    def __repr__(self) -> str:  # storage_options may hold secrets: never shown
        return f"ShardReader({self.url!r}, shards={len(self.manifest.shards)}, options={self.options})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None  # filesystems (and their event loops) are not shared across processes
        state["_pool"] = None
        state["_tile_pool"] = None
        state["_lock"] = None
        state["_roots"] = None
        return state

    def _open_fs(self) -> None:
        if self._fs is None or self._pid != os.getpid():
            if self._fs is not None:
                _INHERITED.append(self._fs)  # a parent's filesystem: never closed here (its loop is not ours)
            self._pid = os.getpid()
            self._pool = self._tile_pool = None  # threads do not survive a fork
            self._roots = None
            self.counts = Counter()  # counted by the parent, reported by the parent
            self._lock = threading.Lock()
            s3 = fsspec.utils.get_protocol(self.url) in ("s3", "s3a")  # one try per layer below our retries
            opts = remote.s3_defaults(self.storage_options, self.options.retry) if s3 else self.storage_options
            self._fs, self._root = storage.open_dir(self.url, opts)
            if s3:
                remote.one_try(self._fs, self.storage_options)

    def take_counts(self) -> dict[str, int]:
        if self._lock is None:
            return {}
        with self._lock:
            out, self.counts = dict(self.counts), Counter()
        return out

    def span(self, span: Span, wanted: frozenset[str], fill_cache: bool = True) -> Iterator[RawSample]:
        """Samples of ``span`` in order, with only the ``wanted`` member suffixes.

        ``fill_cache=False`` uses a cached copy if there is one but does not download the whole
        shard to make one (a peek at one sample).
        """
        self._open_fs()
        info = self.manifest.shards[span.shard_index]
        if info.files is not None:
            yield from self._files_span(info, span, wanted)
            return
        path = fmt.shard_path(self._root, info.name)  # always inside the dataset, whatever the name says
        if storage.is_local(self._fs):
            yield from self._file_span(self._fs, path, info, span, wanted)
            return
        url = storage.url_of(self._fs, path)
        rf = remote.RemoteFile(self._fs, path, url, self.options.retry, on_retry=self._count_retry)
        if self.cache is not None:
            local = self._cached(info, rf) if fill_cache else self.cache.lookup(info)
            if local is not None:
                yield from self._file_span(fsspec.filesystem("file"), str(local), info, span, wanted)
                return
        try:
            size = rf.size()
        except remote.ReadFailed as exc:
            if "not found" in exc.reason:
                raise SampleError(info.name, None, f"shard is missing ({url})") from None
            raise _read_error(exc, url, exc.reason) from None
        if size != info.bytes:
            raise SampleError(info.name, None, f"shard has {size} bytes, the manifest says {info.bytes} (truncated or replaced)")
        if self.options.fetch is Fetch.FSSPEC:
            fs = self._fs
            assert fs is not None
            opener = lambda: storage.open_input(fs, path, block_size=self.options.block_size, cache_type="readahead")  # noqa: E731
            yield from self._file_span(fs, path, info, span, wanted, opener=opener, checked=True)
            return
        yield from self._range_span(rf, info, span, wanted)

    def _files_span(self, info: ShardInfo, span: Span, wanted: frozenset[str]) -> Iterator[RawSample]:
        """An index of image files: each sample's files read whole and checked (:mod:`.infiles`)."""
        if self._roots is None:
            self._roots = RootOpener(self.manifest, self.storage_options, self.options.retry, self.cache, self._count)
        remote_files = fsspec.utils.get_protocol(self.manifest.files.hr) not in ("file", "local")  # type: ignore[union-attr]
        if remote_files and self.options.read_ahead and self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="wdsr-read-ahead")
        pool = self._pool if remote_files else None
        for i, members, ns in file_span(self._roots, info, span, wanted, pool, self.options.read_ahead, self._count_retry):
            hr = (int(info.hr_sizes[i][0]), int(info.hr_sizes[i][1]))
            nbytes = sum(len(v) for v in members.values())
            yield RawSample(info.name, info.keys[i], i, span.rep, members, nbytes, ns, hr, {})

    def _count(self, name: str, n: int = 1) -> None:
        assert self._lock is not None
        with self._lock:  # the read-ahead thread counts too
            self.counts[name] += n

    def _count_retry(self, exc: BaseException) -> None:
        self._count("retries")

    def _cached(self, info: ShardInfo, rf: remote.RemoteFile) -> Path | None:
        assert self.cache is not None
        hit = self.cache.lookup(info)
        if hit is not None:
            self._count("cache_hits")
            return hit

        def download(write: Any) -> None:
            for a in range(0, info.bytes, _FILL_CHUNK):
                write(rf.read(a, min(info.bytes, a + _FILL_CHUNK)))

        try:
            local, downloaded = self.cache.fill(info, download)
        except remote.ReadFailed as exc:
            raise _read_error(exc, rf.url, exc.reason) from None
        except CacheMismatch as exc:
            raise SampleError(info.name, None, exc.reason) from None
        self._count("cache_misses" if downloaded else "cache_hits")
        return local

    def _file_span(
        self, fs: Any, path: str, info: ShardInfo, span: Span, wanted: frozenset[str], opener: Any = None, checked: bool = False
    ) -> Iterator[RawSample]:
        with opener() if opener else _open_shard(fs, path, info) as f:
            if not checked:
                size = os.fstat(f.fileno()).st_size if storage.is_local(fs) else fs.size(path)
                if size != info.bytes:
                    raise SampleError(
                        info.name, None, f"shard has {size} bytes, the manifest says {info.bytes} (truncated or replaced)"
                    )
            if not checked and info.probe is not None:
                self._check_probe(f, path, info)
            local = storage.is_local(fs)
            for i in range(span.start, span.stop):
                t0 = time.perf_counter_ns()
                chunks = [(begin, f, end - begin, begin) for begin, end in _reads(info, i, wanted)]
                yield _raw_sample(info, span, i, chunks, wanted, t0, ranged=local)

    def _check_probe(self, f: Any, path: str, info: ShardInfo) -> None:
        """Is this file the shard the manifest lists (not another build's of the same size)?
        First and last MiB against the manifest's probe, once per process and file version."""
        try:
            st = os.stat(path)
            version = (path, st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            version = None
        if version is not None and version in self._probed:
            return
        if fmt.probe_file(f, info.bytes) != info.probe:
            raise SampleError(
                info.name, None, "shard is not the one the manifest lists (its first/last MiB differ: replaced by another build?)"
            )
        if version is not None:
            self._probed.add(version)

    def _range_span(self, rf: remote.RemoteFile, info: ShardInfo, span: Span, wanted: frozenset[str]) -> Iterator[RawSample]:
        """One range read per sample; ``read_ahead`` samples are on their way while one is decoded."""

        def fetch(i: int) -> tuple[list[tuple[int, bytearray]] | RawSample, int]:
            t0 = time.perf_counter_ns()
            if self._by_tiles(info, i):
                return self._ranged_sample(rf, info, span, i, wanted), 0
            return [(a, rf.read(a, b)) for a, b in _reads(info, i, wanted)], time.perf_counter_ns() - t0

        ahead = self.options.read_ahead
        if ahead and self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="wdsr-read-ahead")
        pool = self._pool
        pending: collections.deque[Future] = collections.deque()
        nxt = span.start
        try:
            for i in range(span.start, span.stop):
                if ahead:
                    while nxt < span.stop and len(pending) <= ahead:
                        assert pool is not None
                        pending.append(pool.submit(fetch, nxt))
                        nxt += 1
                try:
                    data, ns = pending.popleft().result() if ahead else fetch(i)
                except remote.ReadFailed as exc:
                    raise _read_error(exc, rf.url, f"{exc.reason} (sample {info.keys[i]!r})") from None
                if isinstance(data, RawSample):
                    raw = data
                else:
                    chunks = [(a, _View(d), len(d), 0) for a, d in data]
                    raw = _raw_sample(info, span, i, chunks, wanted, time.perf_counter_ns(), ns)
                yield raw
                del data, raw
        finally:
            for fut in pending:
                fut.cancel()

    def _by_tiles(self, info: ShardInfo, i: int) -> bool:
        """Is remote sample ``i`` read by range (tiled, and over ``ranged_tiles_over`` bytes)?"""
        over = self.options.ranged_tiles_over
        if over is None or info.members is not None or not info.tiled(i):
            return False
        ((a, b),) = _reads(info, i, frozenset())
        return b - a > over

    def _ranged_sample(self, rf: remote.RemoteFile, info: ShardInfo, span: Span, i: int, wanted: frozenset[str]) -> RawSample:
        """Remote sample ``i`` with its tiled members as :class:`remote.RangePart`: its tar headers,
        json and the tiles' headers and indexes read now (a few requests of ``_HEAD_READ``), the tiles
        as they are asked for (``prefetch``: concurrently, on a pool of this worker's)."""
        t0 = time.perf_counter_ns()
        if self._tile_pool is None:
            self._tile_pool = ThreadPoolExecutor(_TILE_THREADS, thread_name_prefix="wdsr-tiles")
        ((a, b),) = _reads(info, i, wanted)
        whole = remote.RemoteRange(rf, a, b - a, self._tile_pool)
        members = _members(_RangeFile(whole), b - a, info.name, info.keys[i], wanted, lambda at: whole.part(at.offset, at.size))
        head_bytes, _ = whole.take()  # what was read now; the tiles' bytes are counted as the patches read them
        hr = (int(info.hr_sizes[i][0]), int(info.hr_sizes[i][1]))
        return RawSample(info.name, info.keys[i], i, span.rep, members, head_bytes, time.perf_counter_ns() - t0, hr)


class _RangeFile:
    """A file over a :class:`remote.RemoteRange` for the tar walk through one sample: each read that
    misses what was fetched fetches ``_HEAD_READ`` bytes (a tar header, the json, a tile index)."""

    def __init__(self, whole: remote.RemoteRange) -> None:
        self._whole, self._pos = whole, 0

    def read(self, n: int = -1) -> bytes:
        n = len(self._whole) - self._pos if n < 0 else max(0, min(n, len(self._whole) - self._pos))
        out = self._whole.read(self._pos, n, _HEAD_READ)
        self._pos += n
        return out

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = 0 if whence == io.SEEK_SET else self._pos if whence == io.SEEK_CUR else len(self._whole)
        self._pos = base + offset
        return self._pos


def _read_error(exc: remote.ReadFailed, where: str, reason: str) -> SampleError:
    """The sample error for a read that failed for good: SampleUnavailable where storage's unavailability
    ended it (the command exits 69, not 2: the data may be fine), SampleError otherwise."""
    return (SampleUnavailable if isinstance(exc, remote.ReadUnavailable) else SampleError)(where, None, reason)


def _open_shard(fs: Any, path: str, info: ShardInfo) -> Any:
    """Open a shard file for reading; a local one must be a regular file (a FIFO or a device there
    would block or read without end): a SampleError naming the shard otherwise."""
    try:
        return storage.open_input(fs, path)
    except FileNotFoundError:
        raise SampleError(info.name, None, f"shard is missing ({path})") from None
    except InputError as exc:
        raise SampleError(info.name, None, f"shard {exc.reason} ({path})") from None
    except OSError as exc:
        raise SampleError(info.name, None, f"shard cannot be opened ({exc.strerror or exc.__class__.__name__}: {path})") from None


def _raw_sample(
    info: ShardInfo,
    span: Span,
    i: int,
    chunks: list[tuple[int, Any, int, int]],
    wanted: frozenset[str],
    t0: int,
    read_ns: int = 0,
    ranged: bool = False,
) -> RawSample:
    """Sample ``i`` of ``info`` from its byte ranges: ``(first byte in the shard, file, length, where
    that byte is in the file)`` each (a shard file, or a buffer that holds just the range)."""
    key = info.keys[i]
    digests = None
    if info.members is None:
        _, f, length, at = chunks[0]
        f.seek(at)
        part = (lambda m: FileMember(f, at + m.offset, m.size)) if ranged else None
        members = _members(f, length, info.name, key, wanted, part)
    else:
        members = _indexed_members(chunks, info, i, wanted)
        digests = {name: int(info.members[name].xxh3_64[i]) for name in members}
    return RawSample(
        info.name,
        key,
        i,
        span.rep,
        members,
        sum(len(v) for v in members.values() if not isinstance(v, FileMember)),  # ranged members: counted as read
        read_ns + time.perf_counter_ns() - t0,
        (int(info.hr_sizes[i][0]), int(info.hr_sizes[i][1])),
        digests,
    )


_GAP = 64 << 10  # members of a foreign sample this close are fetched in one read (the bytes between are skipped)


def _reads(info: ShardInfo, i: int, wanted: frozenset[str]) -> list[tuple[int, int]]:
    """The byte ranges to read for sample ``i``: the sample itself in our shards; in an index of
    foreign shards, its wanted members, neighbours (within ``_GAP``) in one range."""
    if info.members is None:
        return [(int(info.offsets[i]), int(info.offsets[i + 1]) if i + 1 < info.samples else info.bytes)]
    spans = sorted((int(c.offsets[i]), int(c.offsets[i]) + int(c.bytes[i])) for n, c in info.members.items() if n in wanted)
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if out and out[-1][1] <= a <= out[-1][1] + _GAP:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _indexed_members(
    chunks: list[tuple[int, Any, int, int]], info: ShardInfo, i: int, wanted: frozenset[str]
) -> dict[str, bytes | memoryview]:
    """The wanted members of foreign sample ``i``, each found at the offset the index records and
    under the name it records (``{key}.{member}``); anything else there is a SampleError."""
    assert info.members is not None
    key = info.keys[i]
    expect = {f"{key}.{n}": (n, int(c.offsets[i])) for n, c in info.members.items() if n in wanted}
    out: dict[str, bytes | memoryview] = {}
    try:
        for start, f, length, at in chunks:
            f.seek(at)
            for e in fmt.iter_entries(f, limit=length, want=expect.__contains__):
                member, offset = expect[e.name]
                if start + e.start != offset:
                    raise SampleError(
                        info.name,
                        key,
                        f"member {e.name!r} is at byte {start + e.start}, the index says {offset} (shard changed?)",
                    )
                out[member] = e.data
    except fmt.TarFormatError as exc:
        raise SampleError(info.name, key, f"bad tar data ({exc})") from None
    for name, (member, offset) in expect.items():
        if member not in out:
            raise SampleError(info.name, key, f"no member {name!r} at byte {offset}, where the index puts it (shard changed?)")
    return out


class _View:
    """A read-only file over a buffer whose large reads are views, not copies (QOI decodes from them)."""

    def __init__(self, data: bytes | bytearray) -> None:
        self._mv = memoryview(data)
        self._pos = 0

    def read(self, n: int = -1) -> bytes | memoryview:
        end = len(self._mv) if n < 0 else min(len(self._mv), self._pos + n)
        out = self._mv[self._pos : end]
        self._pos = end
        return out if len(out) >= _VIEW_MIN else bytes(out)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = offset if whence == io.SEEK_SET else self._pos + offset if whence == io.SEEK_CUR else len(self._mv) + offset
        return self._pos


class FileMember:
    """A tiled member of a local shard, read by range as its tiles are asked for (``os.pread`` on a
    descriptor of its own, closed with the object): a patch reads the tiles it touches, not the
    whole image. ``take`` hands over the bytes read since the last one. Not for pickling: it lives
    in the worker that read it."""

    def __init__(self, f: Any, offset: int, size: int) -> None:
        self._fd = os.dup(f.fileno())
        self._close = weakref.finalize(self, os.close, self._fd)
        self.offset, self.size = offset, size
        self._read = 0

    def __len__(self) -> int:
        return self.size

    def read(self, offset: int, n: int) -> bytes:
        if not (0 <= offset and 0 <= n and offset + n <= self.size):
            raise OSError(f"{n} bytes at {offset} are outside the member's {self.size}")
        out = os.pread(self._fd, n, self.offset + offset)
        self._read += len(out)
        return out

    def take(self) -> tuple[int, int]:
        out, self._read = self._read, 0
        return out, 0  # page-cache reads: their time is the decode's


def _members(
    f: Any, length: int, shard: str, key: str, wanted: frozenset[str], part: Callable[[fmt.MemberAt], Any] | None = None
) -> dict[str, Any]:
    """The wanted members of the sample that starts at ``f``'s position and spans ``length`` bytes;
    with ``part``, tiled members are left unread and given as ``part(where they are)`` (read by range)."""
    out: dict[str, Any] = {}
    ranged = None if part is None else (lambda ext: ext.endswith("." + fmt.TILED))
    try:
        for found, _, members in fmt.iter_samples(f, limit=length, want=wanted.__contains__, ranged=ranged):
            if found != key:
                raise SampleError(shard, key, f"found sample {found!r} where the manifest puts sample {key!r}")
            out = members
            if part is not None:
                for ext, data in out.items():
                    if isinstance(data, fmt.MemberAt):
                        out[ext] = part(data)
    except fmt.TarFormatError as exc:
        raise SampleError(shard, key, f"bad tar data ({exc})") from None
    return out


__getattr__ = deprecation.module_getattr(__name__, {"ReadOptions": ("wdsr.pipeline.read.ReadConfig", ReadConfig)})
