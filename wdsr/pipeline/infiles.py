"""Read samples of an index of image files in place (``shardmaker index DIR``): each sample's wanted
files, whole, checked against the index (size, and xxh3_64 or ETag/mtime where it keeps one) before anything decodes
them, and handed on as a tar sample's members are (``{"hr.png": bytes, "lr_x4.png": bytes}``).

Local files are read through the regular-file opener (symbolic links followed, FIFOs and devices
refused); remote ones with one resilient GET each (``wdsr.store.remote.RemoteFile``: retried, resumed at
the byte reached), ``read_ahead`` samples fetched by a thread while one is decoded. A file that is
missing, of another size or digest is a :class:`SampleError` naming the group, the key and the file."""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import fsspec
import xxhash

from shardmaker import storage
from shardmaker.errors import InputError
from shardmaker.format import FILE_MISSING, Manifest, ShardInfo
from wdsr.errors import SampleError, SampleUnavailable
from wdsr.pipeline.plan import Span
from wdsr.store import remote
from wdsr.store.cache import CacheMismatch, FileEntry, ShardCache

Fetched = tuple[dict[str, bytes | bytearray], int]


class RootOpener:
    """The filesystems of an index's roots (HR, each LR scale), opened once per process."""

    def __init__(
        self,
        manifest: Manifest,
        storage_options: dict[str, Any],
        retry: remote.Retry,
        cache: ShardCache | None = None,
        count: Callable[[str], None] = lambda name: None,
    ) -> None:
        assert manifest.files is not None and manifest.members is not None
        self.files, self.retry, self.cache, self.count = manifest.files, retry, cache, count
        self.side = {manifest.members.hr: None, **{n: s for s, n in manifest.members.lr.items()}}
        self._opened: dict[str, tuple[Any, str, bool]] = {}
        self._options = storage_options

    def where(self, member: str, rel: str) -> tuple[Any, str, bool]:
        """``(filesystem, path, remote)`` of file ``rel`` of ``member``: always under the member's root."""
        root = self.files.root(self.side[member])
        if root not in self._opened:
            s3 = fsspec.utils.get_protocol(root) in ("s3", "s3a")
            opts = remote.s3_defaults(self._options, self.retry) if s3 else self._options
            fs, path = storage.open_dir(root, opts)
            if s3:
                remote.one_try(fs, self._options)
            self._opened[root] = (fs, path, not storage.is_local(fs))
        fs, path, far = self._opened[root]
        return fs, storage.join(path, rel), far


def read_file(
    roots: RootOpener, info: ShardInfo, i: int, member: str, on_retry: Callable[[BaseException], None]
) -> bytes | bytearray:
    """Member ``member`` of sample ``i``: its whole file, checked against the index's size and digest."""
    assert info.files is not None
    cols = info.files[member]
    size, digest, key = int(cols.bytes[i]), int(cols.xxh3_64[i]), info.keys[i]
    fs, path, far = roots.where(member, cols.paths[i])
    url = storage.url_of(fs, path)
    if far:
        rf = remote.RemoteFile(fs, path, url, roots.retry, on_retry=on_retry)
        data: bytes | bytearray = _remote(roots, rf, info, i, member)
        tag = ""
        if roots.files.stamped:  # the responses' ETag (two: replaced mid-read, never a stamp); none: the store's now
            tag = ",".join(sorted(rf.etags)) if rf.etags else storage.file_stamp(fs, path)
    else:
        try:
            with storage.open_regular(path) as f:
                why = roots.files.mismatch((size, digest), os.fstat(f.fileno()).st_size)  # before the read
                if why is not None:
                    raise SampleError(info.name, key, f"{url}: {why}")
                data = f.read()
                tag = storage.file_stamp(fs, path, f) if roots.files.stamped else ""
        except FileNotFoundError:
            raise SampleError(info.name, key, f"{url}: {FILE_MISSING}") from None
        except InputError as exc:
            raise SampleError(info.name, key, f"{url}: {exc.reason}") from None
        except OSError as exc:
            raise SampleError(info.name, key, f"{url}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    xxh3 = xxhash.xxh3_64_intdigest(data) if roots.files.digested else None
    why = roots.files.mismatch((size, digest), len(data), xxh3, tag)
    if why is not None:
        raise SampleError(info.name, key, f"{url}: {why}")
    return data


def _remote(roots: RootOpener, rf: remote.RemoteFile, info: ShardInfo, i: int, member: str) -> bytes | bytearray:
    """A remote file in one GET, or from the node-local cache (``cache_dir=``), which keeps files by
    their xxh3_64 and size (filled by one process per node, checked before it is kept)."""
    assert info.files is not None
    size, digest, key = int(info.files[member].bytes[i]), int(info.files[member].xxh3_64[i]), info.keys[i]

    def get() -> bytearray:
        try:
            return rf.read(0, size)
        except remote.ReadFailed as exc:
            err = SampleUnavailable if isinstance(exc, remote.ReadUnavailable) else SampleError
            raise err(info.name, key, f"{rf.url}: {exc.reason}") from None

    if roots.cache is None or not roots.files.digested:
        return get()
    entry = FileEntry(digest, size)
    hit = roots.cache.lookup(entry)
    if hit is None:
        got: list[bytearray] = []  # what this process downloaded: handed on, not read back from the cache

        def download(write: Any) -> None:
            got.append(get())
            write(got[0])

        try:
            hit, downloaded = roots.cache.fill(entry, download)
        except CacheMismatch as exc:
            raise SampleError(info.name, key, f"{rf.url}: {exc.reason} (changed since it was indexed)") from None
        if hit is None:  # larger than the whole cache
            return got[0] if got else get()
        roots.count("cache_misses" if downloaded else "cache_hits")
        if got:
            return got[0]
    else:
        roots.count("cache_hits")
    with storage.open_regular(str(hit)) as f:
        return f.read()


def file_span(
    roots: RootOpener,
    info: ShardInfo,
    span: Span,
    wanted: frozenset[str],
    pool: ThreadPoolExecutor | None,
    ahead: int,
    on_retry: Callable[[BaseException], None],
) -> Iterator[tuple[int, dict[str, bytes | bytearray], int]]:
    """``(sample index, members, read ns)`` of each sample of ``span``, in order; with a ``pool``,
    ``ahead`` samples are on their way while one is decoded (remote files)."""
    assert info.files is not None
    names = sorted(n for n in info.files if n in wanted)

    def fetch(i: int) -> Fetched:
        t0 = time.perf_counter_ns()
        return {n: read_file(roots, info, i, n, on_retry) for n in names}, time.perf_counter_ns() - t0

    if pool is None or not ahead:
        for i in range(span.start, span.stop):
            members, ns = fetch(i)
            yield i, members, ns
        return
    pending: collections.deque[Future[Fetched]] = collections.deque()
    nxt = span.start
    try:
        for i in range(span.start, span.stop):
            while nxt < span.stop and len(pending) <= ahead:
                pending.append(pool.submit(fetch, nxt))
                nxt += 1
            members, ns = pending.popleft().result()
            yield i, members, ns
    finally:
        for fut in pending:
            fut.cancel()
