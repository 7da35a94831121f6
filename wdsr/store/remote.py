"""Range reads from object storage that survive a flaky network.

A read of ``[start, end)`` that fails part-way (connection reset, timeout, stall, 5xx/SlowDown)
is retried with exponential backoff and resumes at the byte reached, into the same buffer, so
nothing is read twice or lost. Errors that retrying cannot fix (access denied, missing object)
fail at once. On S3 (s3fs) the response body is streamed and resumed at the exact byte; on other
fsspec filesystems the range is read in chunks and resumed at the first chunk not yet received.

We own the retrying: for S3 the layers below (s3fs, botocore) get one attempt each unless the
caller's ``storage_options`` say otherwise, so a dead server fails in bounded time, not minutes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import http.client
import logging
import os
import random
import select
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import fsspec

from shardmaker import storage
from shardmaker.exitcodes import Unavailable
from wdsr.bounds import bounded, check_bounds
from wdsr.store import forks

log = logging.getLogger("wdsr")

_CHUNK = 8 << 20  # generic filesystems: bytes per range request
_PIECE = 1 << 20  # S3: bytes per body read
_JITTER = random.Random()  # backoff jitter only: spreads retries of many workers; never touches data
_PROGRESS = 4 << 20  # a failed try that still brought this much does not count against the budget


@dataclasses.dataclass(frozen=True)
class Retry:
    """How hard to try: ``attempts`` per read (the first included), waits ``backoff_s`` x 2^n
    (with jitter) up to ``max_backoff_s``, and a connection that brings no byte for
    ``timeout_s`` seconds counts as failed."""

    # each field's range is its own (wdsr.bounds): checked here, read by wdsr train's config files
    attempts: int = bounded(8, 1, 1000)
    backoff_s: float = bounded(0.2, 0, 3600)
    max_backoff_s: float = bounded(8.0, 0, 86400)
    timeout_s: float = bounded(30.0, 0, 86400, lo_open=True)

    def __post_init__(self) -> None:
        check_bounds(self, "retry.")

    def wait(self, failures: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (failures - 1))
        return base * (0.5 + _JITTER.random() / 2)


class ReadFailed(OSError):
    """A range read that failed for good: names the object URL and the byte it stopped at."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url, self.reason = url, reason

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # survive the trip from a DataLoader worker
        return (type(self), (self.url, self.reason))


class ReadUnavailable(ReadFailed, Unavailable):
    """A range read that failed every try for reasons trying later may fix (unreachable, throttled, 5xx,
    timeouts): not the data's fault (exit 69, shardmaker.exitcodes)."""


_PERMANENT = (PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError, ValueError, TypeError)
_PERMANENT_CODES = (
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "NoSuchKey",
    "NoSuchBucket",
    "InvalidRange",
    "403",
    "404",
    "416",
)


def is_transient(exc: BaseException) -> bool:
    """Whether trying again may help: network trouble and server overload, not refusals."""
    if isinstance(exc, HttpStatusError):
        return exc.status >= 500 or exc.status in (408, 429)
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.ENOENT):
        return False
    text = str(exc)
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "") if hasattr(exc, "response") else ""
    return not (code in _PERMANENT_CODES or any(f"({c})" in text for c in _PERMANENT_CODES[:6]))


def describe(exc: BaseException) -> str:
    """A short one-line cause for messages; credentials never appear in these."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def s3_defaults(storage_options: dict[str, Any] | None, retry: Retry) -> dict[str, Any]:
    """``storage_options`` for reading from S3: one try per layer below us, our timeouts.

    Whatever the caller set is kept as it is.
    """
    opts = dict(storage_options or {})
    config = dict(opts.get("config_kwargs") or {})
    config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
    config.setdefault("connect_timeout", min(10.0, retry.timeout_s))
    config.setdefault("read_timeout", retry.timeout_s)
    opts["config_kwargs"] = config
    return opts


def one_try(fs: fsspec.AbstractFileSystem, storage_options: dict[str, Any] | None) -> None:
    """s3fs retries each call 5 times on its own (a class attribute); leave that to us."""
    if "retries" not in (storage_options or {}) and hasattr(fs, "retries"):
        fs.retries = 1


class RemoteFile:
    """One object (a shard) read by byte ranges; ``on_retry`` is told of every failed try.

    ``sleep`` waits out the backoff between tries (``time.sleep``; tests pass a clock of their own).
    """

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        url: str,
        retry: Retry,
        on_retry: Callable[[BaseException], None] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.fs, self.path, self.url, self.retry = fs, path, url, retry
        self.on_retry = on_retry
        self.sleep = sleep if sleep is not None else time.sleep
        self._s3 = storage.is_s3(fs) and hasattr(fs, "_call_s3")  # s3fs: stream and resume at the byte
        self.etags: set[str] = set()  # the ETag of every S3 response read from (one, unless replaced mid-read)

    def _attempt(self, what: str, fn: Callable[[], Any]) -> Any:
        failures = 0
        while True:
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - sorted below
                failures = self._failed(exc, failures, what)

    def _failed(self, exc: BaseException, failures: int, what: str) -> int:
        if isinstance(exc, ReadFailed):
            raise exc
        if not is_transient(exc):
            if isinstance(exc, PermissionError) or "AccessDenied" in str(exc) or "Signature" in str(exc):
                raise ReadFailed(
                    self.url,
                    f"access denied while reading {what} ({describe(exc)}); check the "
                    "credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or storage_options)",
                ) from None
            if isinstance(exc, FileNotFoundError):
                raise ReadFailed(self.url, f"object not found while reading {what}") from None
            raise ReadFailed(self.url, f"cannot read {what} ({describe(exc)})") from None
        failures += 1
        if failures >= self.retry.attempts:
            raise ReadUnavailable(self.url, f"gave up reading {what} after {failures} tries (last: {describe(exc)})") from None
        if self.on_retry is not None:
            self.on_retry(exc)
        log.debug("retrying %s %s after %s", self.url, what, describe(exc))
        self.sleep(self.retry.wait(failures))
        return failures

    def size(self) -> int:
        return int(self._attempt("its size", lambda: self.fs.size(self.path)))

    def read(self, start: int, end: int) -> bytearray:
        """Bytes ``[start, end)``, resumed at the byte reached after each failure."""
        buf = bytearray(end - start)
        got = [0]  # bytes of buf filled so far; survives failed tries
        failures = 0
        while got[0] < len(buf):
            before = got[0]
            try:
                if self._s3:
                    self._s3_into(buf, start, got)
                else:
                    self._chunks_into(buf, start, got)
            except Exception as exc:  # noqa: BLE001 - sorted in _failed
                if got[0] - before >= _PROGRESS:
                    failures = 0  # real progress: the budget is for a stuck read, not a long one
                failures = self._failed(exc, failures, f"bytes {start + got[0]}-{end - 1}")
        return buf

    def _chunks_into(self, buf: bytearray, start: int, got: list[int]) -> None:
        while got[0] < len(buf):
            a = start + got[0]
            b = min(start + len(buf), a + _CHUNK)
            data = self.fs.cat_file(self.path, start=a, end=b)
            if len(data) != b - a:
                raise ConnectionError(f"short read: {len(data)} of {b - a} bytes at {a}")
            buf[got[0] : got[0] + len(data)] = data
            got[0] += len(data)

    def _s3_into(self, buf: bytearray, start: int, got: list[int]) -> None:
        token = getattr(self.fs, "_fs_token", id(self.fs))
        # requester-pays / SSE-C and similar need request headers a presigned URL does not carry
        url = None if token in _NO_PRESIGN or getattr(self.fs, "s3_additional_kwargs", None) else _presigned(self.fs, self.path)
        if url is None:  # stream through s3fs/aiohttp instead
            fsspec.asyn.sync(self.fs.loop, self._s3_stream, buf, start, got)
            return
        try:
            tag = _http_range_into(url, buf, start, got, self.retry.timeout_s)
            if tag:
                self.etags.add(tag.strip('"'))
        except PermissionError:
            # refused as presigned: try once the way s3fs signs requests (it raises if that is refused too)
            fsspec.asyn.sync(self.fs.loop, self._s3_stream, buf, start, got)
            _NO_PRESIGN.add(token)

    async def _s3_stream(self, buf: bytearray, start: int, got: list[int]) -> None:
        bucket, key, version = self.fs.split_path(self.path)
        extra = {"VersionId": version} if version else {}
        first = start + got[0]
        resp = await asyncio.wait_for(
            self.fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={first}-{start + len(buf) - 1}", **extra),
            self.retry.timeout_s,
        )
        body = resp["Body"]
        if resp.get("ETag"):
            self.etags.add(str(resp["ETag"]).strip('"'))
        try:
            view = memoryview(buf)
            while got[0] < len(buf):
                piece = await asyncio.wait_for(body.read(min(_PIECE, len(buf) - got[0])), self.retry.timeout_s)
                if not piece:
                    raise ConnectionError(f"response ended at byte {start + got[0]} of {start + len(buf)}")
                view[got[0] : got[0] + len(piece)] = piece
                got[0] += len(piece)
        finally:
            body.close()


# ---- S3 range GETs over plain http.client, into the caller's buffer ---------------------------
# Measured against SeaweedFS here (python -m bench.s3_client_cpu): ~0.5 ms of client CPU per MB, against
# ~0.8 through s3fs/aiohttp, and no event loop thread competing with the decoder for the GIL.
_URL_TTL_S = 3600
_urls: dict[tuple[Any, str], tuple[str, float]] = {}
_NO_PRESIGN: set[Any] = set()  # filesystems whose presigned GETs were refused but signed ones were not
_local = threading.local()
# a forked DataLoader worker must not share its parent's sockets, nor close its parent's sessions
os.register_at_fork(after_in_child=lambda: setattr(_local, "pool", {}))
os.register_at_fork(after_in_child=forks.keep_inherited)


def _presigned(fs: Any, path: str) -> str | None:
    """A SigV4 presigned GET URL for ``path`` (cached, renewed well before it expires)."""
    key = (getattr(fs, "_fs_token", id(fs)), path)
    hit = _urls.get(key)
    if hit is not None and time.monotonic() - hit[1] < _URL_TTL_S / 2:
        return hit[0]
    try:
        url = fs.url(path, expires=_URL_TTL_S)
    except Exception:  # noqa: BLE001 - no presigning here: the caller falls back to aiohttp
        return None
    _urls[key] = (url, time.monotonic())
    return url


def _connection(scheme: str, host: str, port: int | None, timeout: float) -> http.client.HTTPConnection:
    pool = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = {}
    key = (scheme, host, port, timeout)
    conn = pool.get(key)
    if conn is not None and not _reusable(conn):
        _drop_connection(conn)  # closed by the server while idle (its keep-alive timeout): a new one, not a failed try
        conn = None
    if conn is None:
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        conn = pool[key] = cls(host, port, timeout=timeout)
    return conn


def _reusable(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle pooled connection can take a request: readable while idle means the server
    closed it (EOF) or sent something unasked; either way it is dropped (as urllib3 does)."""
    if conn.sock is None:
        return True  # not connected: http.client connects on the next request
    try:
        readable, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _drop_connection(conn: http.client.HTTPConnection) -> None:
    conn.close()
    pool = getattr(_local, "pool", {})
    for key, value in list(pool.items()):
        if value is conn:
            del pool[key]


class HttpStatusError(OSError):
    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"HTTP {status}{f' {code}' if code else ''}")
        self.status, self.code = status, code


def _http_range_into(url: str, buf: bytearray, start: int, got: list[int], timeout: float) -> str | None:
    """Bytes ``[start + got[0], start + len(buf))`` of ``url`` into ``buf`` (``got`` moved on as they come);
    the response's ETag."""
    u = urllib.parse.urlsplit(url)
    conn = _connection(u.scheme, u.hostname or "", u.port, timeout)
    first, last = start + got[0], start + len(buf) - 1
    try:
        conn.request("GET", f"{u.path}?{u.query}", headers={"Range": f"bytes={first}-{last}"})
        resp = conn.getresponse()
        if resp.status not in (200, 206):
            body = resp.read(65536).decode("utf-8", "replace")
            code = body.split("<Code>", 1)[1].split("</Code>", 1)[0] if "<Code>" in body else ""
            _drop_connection(conn)
            if resp.status in (403, 401):
                if "expired" in body.lower():
                    _urls.clear()
                    raise ConnectionError(f"presigned URL expired ({code})")
                raise PermissionError(f"HTTP {resp.status} {code or 'AccessDenied'}")
            if resp.status == 404:
                raise FileNotFoundError(f"HTTP 404 {code or 'NoSuchKey'}")
            if resp.status == 416:
                raise ValueError(f"HTTP 416 {code or 'InvalidRange'}")
            raise HttpStatusError(resp.status, code)
        if resp.status == 200 and first != 0:
            raise ValueError("the server ignored the Range header")
        view = memoryview(buf)
        while got[0] < len(buf):
            # read1: at most one recv, so a failure loses nothing already received
            piece = resp.read1(min(_PIECE, len(buf) - got[0]))
            if not piece:
                raise ConnectionError(f"response ended at byte {start + got[0]} of {start + len(buf)}")
            view[got[0] : got[0] + len(piece)] = piece
            got[0] += len(piece)
        if resp.read(1):
            raise ValueError("the response is longer than the range asked for")
        return resp.getheader("ETag")
    except BaseException:
        _drop_connection(conn)
        raise


# ---- one sample of a shard, read by the pieces asked for -----------------------------------------
_MERGE_GAP = 64 << 10  # spans this close are fetched in one request (the bytes between are read and kept)
_MAX_REQUEST = 8 << 20  # a merged request grows no larger (a whole member comes as several, concurrently)


class RemoteRange:
    """Bytes ``[start, start + size)`` of a :class:`RemoteFile` (a sample of a shard), read by the
    pieces asked for, each fetched once and kept for the object's life.

    ``read`` serves bytes fetched already (waiting for a prefetch under way), else fetches them (at
    least ``at_least`` bytes: a walk through tar headers). ``prefetch`` fetches many spans at once:
    near ones merged into one request, the requests run on ``pool`` (concurrently) while the caller
    goes on. Every request is a :meth:`RemoteFile.read`: retries and resumes as any. ``take`` hands
    over the bytes fetched and the time spent waiting for them since the last ``take``."""

    def __init__(self, rf: RemoteFile, start: int, size: int, pool: Any = None) -> None:
        self.rf, self.start, self.size, self._pool = rf, start, size, pool
        self._pieces: list[tuple[int, int, Any]] = []  # (first, end, bytearray or a Future of one), relative
        self._lock = threading.Lock()
        self._fetched = self._wait_ns = 0

    def __len__(self) -> int:
        return self.size

    def part(self, offset: int, size: int) -> RangePart:
        """The member at ``offset`` (``size`` bytes) as a reader of its own offsets."""
        return RangePart(self, offset, size)

    def take(self) -> tuple[int, int]:
        with self._lock:
            out = (self._fetched, self._wait_ns)
            self._fetched = self._wait_ns = 0
        return out

    def read(self, offset: int, n: int, at_least: int = 0) -> bytes:
        if not (0 <= offset and 0 <= n and offset + n <= self.size):
            raise ValueError(f"{n} bytes at {offset} are outside the range's {self.size}")
        t0 = time.perf_counter_ns()
        for a, b, got in self._pieces:
            if a <= offset and offset + n <= b:
                data = got if isinstance(got, bytearray) else got.result()  # a prefetch's ReadFailed is raised here
                break
        else:
            a = offset
            data = self._fetch(a, min(self.size, max(offset + n, offset + at_least)))
            self._pieces.append((a, a + len(data), data))
        with self._lock:
            self._wait_ns += time.perf_counter_ns() - t0
        return bytes(data[offset - a : offset - a + n])

    def prefetch(self, spans: list[tuple[int, int]]) -> None:
        """Start fetching the ``(offset, length)`` spans not fetched (or under way) already."""
        todo = sorted((a, a + n) for a, n in spans if n > 0 and not self._covered(a, a + n))
        merged: list[list[int]] = []
        for a, b in todo:
            if merged and a <= merged[-1][1] + _MERGE_GAP and b - merged[-1][0] <= _MAX_REQUEST:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        for a, b in merged:
            for lo in range(a, b, _MAX_REQUEST):  # one span larger than a request: in several
                hi = min(b, lo + _MAX_REQUEST)
                got = self._pool.submit(self._fetch, lo, hi) if self._pool is not None else self._fetch(lo, hi)
                self._pieces.append((lo, hi, got))

    def _covered(self, a: int, b: int) -> bool:
        return any(x <= a and b <= y for x, y, _ in self._pieces)

    def _fetch(self, a: int, b: int) -> bytearray:
        data = self.rf.read(self.start + a, self.start + b)
        with self._lock:
            self._fetched += len(data)
        return data


class RangePart:
    """One member inside a :class:`RemoteRange`: ``read(offset, n)`` and ``prefetch`` in the member's
    own offsets (the ``RangeReader`` of ``shardmaker.imaging.tiled``); a failed read is a ReadFailed."""

    def __init__(self, whole: RemoteRange, offset: int, size: int) -> None:
        self.whole, self.offset, self.size = whole, offset, size

    def __len__(self) -> int:
        return self.size

    def read(self, offset: int, n: int) -> bytes:
        if not (0 <= offset and 0 <= n and offset + n <= self.size):
            raise OSError(f"{n} bytes at {offset} are outside the member's {self.size}")
        return self.whole.read(self.offset + offset, n)

    def prefetch(self, spans: list[tuple[int, int]]) -> None:
        self.whole.prefetch([(self.offset + a, n) for a, n in spans])

    def take(self) -> tuple[int, int]:
        return self.whole.take()
