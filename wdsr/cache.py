"""A node-local shard cache for remote datasets: whole shards, LRU eviction under a byte limit.

Safe with many workers and ranks on one node sharing ``cache_dir``: a shard is filled by one
process at a time (an ``flock`` per shard; the others wait, then read the finished file), into a
temp file that is checked against the manifest's size and sha256 before it is renamed into
place, so no reader ever sees a torn file. Files are named by content hash, so two datasets (or
a rebuilt one) never share an entry by mistake. Eviction holds a cache-wide lock; a file removed
while another process reads it stays readable to that process (POSIX unlink).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from shardmaker.format.manifest import ShardInfo

log = logging.getLogger("wdsr")
_PARTIAL = ".partial"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class CacheMismatch(ValueError):
    """The downloaded shard is not the one the manifest describes."""

    def __init__(self, shard: str, reason: str) -> None:
        super().__init__(f"{shard}: {reason}")
        self.reason = reason


class ShardCache:
    def __init__(self, root: str | os.PathLike, limit: int | None = None) -> None:
        if limit is not None and limit <= 0:
            raise ValueError(f"cache_limit must be a positive number of bytes, got {limit}")
        self.root = Path(root)
        self.limit = limit
        self._too_big_logged = False

    def path(self, info: ShardInfo) -> Path:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", info.name)
        return self.root / f"{info.sha256[:16]}-{safe}"

    def lookup(self, info: ShardInfo) -> Path | None:
        """The cached copy, if complete; marks it recently used."""
        path = self.path(info)
        try:
            if path.stat().st_size == info.bytes:
                os.utime(path)
                return path
        except FileNotFoundError:
            pass
        return None

    def fill(self, info: ShardInfo, download: Callable[[Callable[[bytes], None]], None]) -> tuple[Path | None, bool]:
        """``(path, downloaded)``: the cached copy, made by ``download(write)`` if nobody has yet.

        ``download`` calls ``write`` with the shard's bytes in order. Returns ``(None, False)``
        when the shard alone is larger than the cache limit (read it remotely instead).
        """
        if self.limit is not None and info.bytes > self.limit:
            if not self._too_big_logged:
                self._too_big_logged = True
                log.warning("cache_limit %d B is smaller than shard %s (%d B): such shards are not cached",
                            self.limit, info.name, info.bytes)
            return None, False
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path(info)
        with _locked(final.with_name(final.name + ".lock")):
            hit = self.lookup(info)
            if hit is not None:
                return hit, False  # filled by another process while we waited
            for stale in self.root.glob(final.name + ".*" + _PARTIAL):  # left by a killed process
                stale.unlink(missing_ok=True)
            self._make_room(info.bytes, final)
            temp = final.with_name(f"{final.name}.{os.getpid()}{_PARTIAL}")
            digest = hashlib.sha256()
            try:
                with open(temp, "wb") as f:
                    def write(data: bytes) -> None:
                        digest.update(data)
                        f.write(data)
                    download(write)
                    size = f.tell()
                if size != info.bytes or digest.hexdigest() != info.sha256:
                    raise CacheMismatch(info.name, f"the object has {size} bytes / sha256 {digest.hexdigest()[:16]}..., "
                                        f"the manifest says {info.bytes} / {info.sha256[:16]}... (replaced or corrupt)")
                os.replace(temp, final)
            except BaseException:
                temp.unlink(missing_ok=True)
                raise
        return final, True

    def entries(self) -> list[os.DirEntry]:
        try:
            with os.scandir(self.root) as it:
                return [e for e in it if e.is_file() and not e.name.endswith((".lock", _PARTIAL))]
        except FileNotFoundError:
            return []

    def used(self) -> int:
        return sum(e.stat().st_size for e in self.entries())

    def _make_room(self, need: int, keep: Path) -> None:
        """Evict least recently used shards until ``need`` more bytes fit under the limit."""
        if self.limit is None:
            return
        with _locked(self.root / ".evict.lock"):
            files = sorted(((e.stat().st_mtime, e.stat().st_size, e.path) for e in self.entries()), key=lambda t: t[0])
            total = sum(size for _, size, _ in files)
            for _, size, path in files:
                if total + need <= self.limit:
                    break
                if path == str(keep):
                    continue
                Path(path).unlink(missing_ok=True)  # its .lock stays: a waiter may hold it open
                total -= size
                log.debug("cache: evicted %s", path)
