"""One read per file when ``shardmaker index`` lists images in place: the scan's sizer
(``builder.sources.Sizer``) that reads each listed file once, by a pool of threads, and keeps what the
index needs of it (size, header, xxh3_64 or, ``--no-digest``, that of its stamp: mtime_ns locally, the
listed ETag remotely) in a compact record.

The header and the digest come from the same bytes: a remote file is one GET (the whole object, or
with ``--no-digest`` its first ``HEAD_BYTES``), a local one one open. A file larger than any image within
``max_pixels`` (or than its own header's image) is refused before it is read whole."""

from __future__ import annotations

import os
import posixpath
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import xxhash

from shardmaker import storage
from shardmaker.errors import InputError
from shardmaker.format import headers
from shardmaker.format import manifest as mf
from shardmaker.format.files import stamp_digest

_CHUNK = 8 << 20
_WINDOW = 1024  # files submitted to the readers at a time


class FileEntry(NamedTuple):
    """What the index keeps of one file (a tuple of 6 ints)."""

    size: int
    xxh3_64: int  # without a digest (--no-digest): the stamp's (format.files.stamp_digest of mtime_ns or ETag)
    width: int
    height: int
    channels: int
    bit_depth: int

    @property
    def header(self) -> headers.ImageHeader:
        return headers.ImageHeader(self.width, self.height, self.channels, self.bit_depth)


def _checked(path: str, size: int, member: str, first: bytes, max_pixels: int) -> headers.ImageHeader:
    try:
        head = headers.image_header(first, member)
    except headers.HeaderError as exc:
        raise InputError(path, str(exc)) from None
    if size > headers.member_limit(member, max_pixels, head):
        raise InputError(path, f"{size} bytes: larger than a {head.width}x{head.height} image can be")
    if head.pixels > max_pixels:
        raise InputError(path, f"{head.width}x{head.height} = {head.pixels} pixels is over max_pixels={max_pixels}")
    return head


def _too_big(path: str, size: int, member: str, max_pixels: int) -> None:
    if size > headers.member_limit(member, max_pixels):
        raise InputError(path, f"{size} bytes: larger than any {mf.codec_of(member)} image within max_pixels={max_pixels}")


def read_entry(fs: Any, path: str, max_pixels: int, digest: bool, stamp: str = "") -> FileEntry:
    """A file's size, header and (``digest``) xxh3_64 from one read; an InputError naming it when it is
    not a regular file, not of a format streamed in place, has no readable header, or is larger than
    its image can be. ``stamp``: the listing's ``size:tag`` (remote: the size and ETag are taken from it)."""
    try:
        return _read_entry(fs, path, max_pixels, digest, stamp)
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None


def _read_entry(fs: Any, path: str, max_pixels: int, digest: bool, stamp: str) -> FileEntry:
    member = "hr" + posixpath.splitext(path)[1].lower()
    if mf.codec_of(member) not in mf.MEMBER_CODECS or mf.codec_of(member) == mf.MIXED:
        raise InputError(path, f".{mf.codec_of(member)} files are not streamed in place; build shards of them")
    if storage.is_local(fs):
        with storage.open_regular(path) as f:
            st = os.fstat(f.fileno())
            size, tag = st.st_size, str(st.st_mtime_ns)
            _too_big(path, size, member, max_pixels)
            first = f.read(min(size, headers.HEAD_BYTES))  # reads sized to the file: no 1-8 MiB buffer a small file
            head = _checked(path, size, member, first, max_pixels)
            h, left = xxhash.xxh3_64(first), size - len(first)
            while digest and left > 0 and (chunk := f.read(min(left, _CHUNK))):
                h.update(chunk)
                left -= len(chunk)
    else:
        listed, _, tag = stamp.partition(":")
        size = int(listed) if listed.isdigit() else storage.size_of(fs, path)
        _too_big(path, size, member, max_pixels)
        want = size if digest else min(size, headers.HEAD_BYTES)
        data = storage.read_range(fs, path, 0, want)  # one GET: the whole object, or its head
        if len(data) != want:
            raise InputError(path, f"{len(data)} bytes read, {size} listed (changed while indexing?)")
        head = _checked(path, size, member, data[: headers.HEAD_BYTES], max_pixels)
        h = xxhash.xxh3_64(data)
    kept = h.intdigest() if digest else stamp_digest(tag)
    return FileEntry(size, kept, head.width, head.height, head.channels, head.bit_depth)


class FileReads:
    """The sizer ``shardmaker index`` gives the scan: each file read once (:func:`read_entry`) by
    ``workers`` threads, its entry kept under its URL for the index (``entries``)."""

    def __init__(self, workers: int, max_pixels: int, digest: bool, tick: Any = None) -> None:
        self.workers, self.max_pixels, self.digest = workers, max_pixels, digest
        self.entries: dict[str, FileEntry] = {}
        self.tick = tick  # called once a file (a progress bar's update)
        self._lock = threading.Lock()

    def __call__(self, fs: Any, paths: Sequence[str], stamps: Mapping[str, str]) -> list[tuple[int, int] | InputError]:
        def one(path: str) -> tuple[int, int] | InputError:
            try:
                e = read_entry(fs, path, self.max_pixels, self.digest, stamps.get(path, ""))
            except InputError as exc:
                return exc
            finally:
                if self.tick is not None:
                    self.tick()
            with self._lock:
                self.entries[storage.url_of(fs, path)] = e
            return e.width, e.height

        if not storage.is_local(fs):
            fs.invalidate_cache()  # the listing's copy in fsspec's directory cache: sizes and ETags come with ``stamps``
        out: list[tuple[int, int] | InputError] = []
        with ThreadPoolExecutor(self.workers) as pool:
            for a in range(0, len(paths), _WINDOW):  # a window of futures at a time: memory does not grow with them
                out += pool.map(one, paths[a : a + _WINDOW])
        return out
