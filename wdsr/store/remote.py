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

    attempts: int = 8
    backoff_s: float = 0.2
    max_backoff_s: float = 8.0
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.backoff_s < 0 or self.timeout_s <= 0:
            raise ValueError(f"bad retry policy {self}: attempts >= 1, backoff_s >= 0, timeout_s > 0")

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
            raise ReadFailed(self.url, f"gave up reading {what} after {failures} tries (last: {describe(exc)})") from None
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
            _http_range_into(url, buf, start, got, self.retry.timeout_s)
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
# a forked DataLoader worker must not share its parent's sockets
os.register_at_fork(after_in_child=lambda: setattr(_local, "pool", {}))


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


def _http_range_into(url: str, buf: bytearray, start: int, got: list[int], timeout: float) -> None:
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
    except BaseException:
        _drop_connection(conn)
        raise
