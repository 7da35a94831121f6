"""A node-local shard cache for remote datasets: whole shards, LRU eviction under a byte limit.

Safe with many workers and ranks on one node sharing ``cache_dir``: a shard is filled by one
process at a time (an ``flock`` per shard; the others wait, then read the finished file), into a
temp file that is checked against the manifest's size and sha256 before it is renamed into
place, so no reader ever sees a torn file. Files are named by content hash, so two datasets (or
a rebuilt one) never share an entry by mistake. Eviction holds a cache-wide lock; a file removed
while another process reads it stays readable to that process (POSIX unlink).

Hygiene: the cache lives in its own subfolder ``cache_dir/wdsr-shard-cache`` (with a marker
file) and only ever touches names it made there (pattern-checked), never the user's other files.
A cached shard counts as a hit only with the ``.ok`` record written when its fill was checked
(sha256, size, inode, mtime): a file that was put there some other way is refilled, not trusted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import xxhash

from shardmaker import storage

log = logging.getLogger("wdsr")
_PARTIAL = ".partial"
SUBDIR = "wdsr-shard-cache"
_MARKER = ".wdsr-shard-cache"
_ENTRY = re.compile(r"[0-9a-f]{16}-[A-Za-z0-9][A-Za-z0-9_.-]*\.tar")  # what we name cached shards


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class Entry(Protocol):
    """What the cache keys an entry by: a shard's manifest entry, or a :class:`FileEntry`."""

    @property
    def name(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def bytes(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """A file of an index of image files (``shardmaker index DIR``), kept by content: its xxh3_64 (in
    ``sha256``'s place: what the fill checks) and size. Files of the same bytes share one entry."""

    xxh3_64: int
    bytes: int

    @property
    def name(self) -> str:
        return f"file-{self.bytes}.tar"

    @property
    def sha256(self) -> str:
        return f"{self.xxh3_64:016x}"


def _hasher(entry: Entry) -> Any:
    """The digest a fill checks: sha256 for a shard, xxh3_64 for a file."""
    return xxhash.xxh3_64() if isinstance(entry, FileEntry) else hashlib.sha256()


class CacheMismatch(ValueError):
    """The downloaded shard is not the one the manifest describes."""

    def __init__(self, shard: str, reason: str) -> None:
        super().__init__(f"{shard}: {reason}")
        self.reason = reason


class ShardCache:
    def __init__(self, root: str | os.PathLike, limit: int | None = None) -> None:
        if limit is not None and limit <= 0:
            raise ValueError(f"cache_limit must be a positive number of bytes, got {limit}")
        self.user_root = Path(root)
        self.root = self.user_root / SUBDIR
        self.limit = limit
        self._too_big_logged = False

    def _ensure(self) -> None:
        """Make our subfolder (with its marker); refuse one of that name that is not ours.

        Workers and ranks starting together on a fresh node all get here at once: the check and
        the marker are made under a lock on the folder itself, so that no process takes another's
        first entries (made once its marker was written) for a stranger's files."""
        if (self.root / _MARKER).is_file():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if (self.root / _MARKER).is_file():
                return  # another process made it while this one waited
            if any(e.name != _MARKER for e in os.scandir(self.root)):
                raise ValueError(
                    f"{self.root} exists and is not a wdsr shard cache (no {_MARKER}); choose another cache_dir or remove it"
                )
            (self.root / _MARKER).write_text("wdsr shard cache: files here are managed (and deleted) by wdsr\n")
        finally:
            os.close(fd)  # releases the lock

    def path(self, info: Entry) -> Path:
        name = f"{info.sha256[:16]}-{info.name}"
        if not _ENTRY.fullmatch(name):  # manifests are checked already; never build a path from anything else
            raise ValueError(f"shard {info.name!r}: not a name the cache can hold")
        return self.root / name

    @staticmethod
    def _ok(path: Path) -> Path:
        return path.with_name(path.name + ".ok")

    def lookup(self, info: Entry) -> Path | None:
        """The cached copy if this cache filled and checked it; marks it recently used."""
        path = self.path(info)
        try:
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):
                return None  # a FIFO or a device at a shard's name: refilled (replaced), never read
            with storage.open_regular(str(self._ok(path)), follow_symlinks=False) as f:  # never blocks on a FIFO
                record = json.loads(f.read(4096))
        except (OSError, ValueError):  # InputError (not a regular file) is a ValueError
            return None
        if (
            record != {"sha256": info.sha256, "size": info.bytes, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns}
            or st.st_size != info.bytes
        ):
            return None  # replaced or planted since it was checked: not trusted
        with contextlib.suppress(OSError):
            os.utime(self._ok(path))  # LRU order lives on the record, so the shard's own stamp stays
        return path

    def fill(self, info: Entry, download: Callable[[Callable[[bytes], None]], None]) -> tuple[Path | None, bool]:
        """``(path, downloaded)``: the cached copy, made by ``download(write)`` if nobody has yet.

        ``download`` calls ``write`` with the shard's bytes in order. Returns ``(None, False)``
        when the shard alone is larger than the cache limit (read it remotely instead).
        """
        if self.limit is not None and info.bytes > self.limit:
            if not self._too_big_logged:
                self._too_big_logged = True
                log.warning(
                    "cache_limit %d B is smaller than shard %s (%d B): such shards are not cached",
                    self.limit,
                    info.name,
                    info.bytes,
                )
            return None, False
        self._ensure()
        final = self.path(info)
        with _locked(final.with_name(final.name + ".lock")):
            hit = self.lookup(info)
            if hit is not None:
                return hit, False  # filled by another process while we waited
            for stale in self.root.glob(final.name + ".*" + _PARTIAL):  # left by a killed process
                stale.unlink(missing_ok=True)
            self._ok(final).unlink(missing_ok=True)
            self._make_room(info.bytes, final)
            temp = final.with_name(f"{final.name}.{os.getpid()}{_PARTIAL}")
            digest = _hasher(info)
            try:
                with open(temp, "wb") as f:

                    def write(data: bytes) -> None:
                        digest.update(data)
                        f.write(data)

                    download(write)
                    size = f.tell()
                if size != info.bytes or digest.hexdigest() != info.sha256:
                    raise CacheMismatch(
                        info.name,
                        f"the object has {size} bytes / {digest.name} {digest.hexdigest()[:16]}..., "
                        f"the manifest says {info.bytes} / {info.sha256[:16]}... (replaced or corrupt)",
                    )
                os.replace(temp, final)
                st = final.stat()
                record = {"sha256": info.sha256, "size": info.bytes, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns}
                ok_temp = self._ok(final).with_name(self._ok(final).name + _PARTIAL)
                ok_temp.write_text(json.dumps(record))
                os.replace(ok_temp, self._ok(final))
            except BaseException:
                temp.unlink(missing_ok=True)
                raise
        return final, True

    def entries(self) -> list[os.DirEntry]:
        """Cached shards (names we made); nothing else in the folder is ever listed, counted or deleted."""
        try:
            with os.scandir(self.root) as it:
                return [e for e in it if e.is_file(follow_symlinks=False) and _ENTRY.fullmatch(e.name)]
        except FileNotFoundError:
            return []

    def used(self) -> int:
        return sum(e.stat().st_size for e in self.entries())

    def _used_at(self, e: os.DirEntry) -> float:
        try:
            return self._ok(Path(e.path)).stat().st_mtime
        except FileNotFoundError:
            return 0.0  # unchecked: evicted first

    def _make_room(self, need: int, keep: Path) -> None:
        """Evict least recently used shards until ``need`` more bytes fit under the limit."""
        if self.limit is None:
            return
        with _locked(self.root / ".evict.lock"):
            files = sorted(((self._used_at(e), e.stat().st_size, e.path) for e in self.entries()), key=lambda t: t[0])
            total = sum(size for _, size, _ in files)
            for _, size, path in files:
                if total + need <= self.limit:
                    break
                if path == str(keep):
                    continue
                self._ok(Path(path)).unlink(missing_ok=True)
                Path(path).unlink(missing_ok=True)  # its .lock stays: a waiter may hold it open
                total -= size
                log.debug("cache: evicted %s", path)
