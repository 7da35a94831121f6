"""Exit codes: the contract of both command lines (``shardmaker``, ``wdsr``) with whatever runs them.

A Kubernetes Job (``k8s/``) decides on them: bad input fails the run at once, unavailable storage is
retried within a bounded budget, anything else counts as a crash. One place for the numbers and for
sorting an error into them; ``wdsr`` imports it (a public door of ``shardmaker``).
"""

from __future__ import annotations

import enum
import errno
import socket
from typing import Any

__all__ = ["ExitCode", "Unavailable", "exit_code_of", "unavailable"]


class ExitCode(enum.IntEnum):
    """What a process's exit status says (docs/kubernetes.md, "Exit codes")."""

    OK = 0  # done (or stopped by SIGTERM after a checkpoint)
    FAILED = 1  # a crash: anything not sorted below (a bug, a lost peer, an OOM-killed rank)
    BAD_INPUT = 2  # input or settings that cannot become valid by trying again: fix them first
    WORKER_DIED = 3  # wdsr train: a DataLoader worker died (killed by a signal, out of memory)
    UNAVAILABLE = 69  # EX_UNAVAILABLE: storage or network unreachable, throttled, 5xx, timing out
    PEER_STOPPED = 75  # EX_TEMPFAIL: a rank stopped because another was told to (a preemption)
    INTERRUPTED = 130  # Ctrl-C


class Unavailable(Exception):
    """Mixed into an error type that means "storage or network unavailable": trying later may work."""


# Exception classes (by name, anywhere in the type's MRO: botocore, aiohttp, urllib3, requests, builtins)
# that mean the other side could not be reached, went away or did not answer in time.
_NETWORK = frozenset(
    {
        "ConnectionError",  # builtin (refused, reset, aborted), botocore (EndpointConnectionError, ...), requests
        "TimeoutError",  # builtin, asyncio, socket.timeout, urllib3
        "HTTPClientError",  # botocore: ReadTimeoutError, ConnectionClosedError, ...
        "ClientConnectionError",  # aiohttp: ClientConnectorError, ServerDisconnectedError, ...
        "ClientPayloadError",  # aiohttp: a body cut short
        "ResponseStreamingError",  # botocore
        "IncompleteReadError",  # botocore
        "IncompleteRead",  # http.client
        "ServiceRequestError",  # azure-core
        "ServiceResponseError",  # azure-core
        "TransportError",  # google-auth
    }
)
_NETWORK_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.EHOSTDOWN,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.ENETRESET,
        errno.EAGAIN,
        errno.EBUSY,  # s3fs: SlowDown, ServiceUnavailable, OperationAborted
        errno.EREMOTEIO,  # s3fs: InternalError
    }
)
# S3 error codes of a server that is overloaded or failing, not of a refusal
_BUSY_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeoutException",
        "OperationAborted",
        "BandwidthLimitExceeded",
    }
)
_CLIENTS = ("botocore", "aiobotocore", "s3fs", "aiohttp", "gcsfs", "adlfs", "google", "azure", "urllib3", "requests")


def _status(exc: BaseException) -> tuple[int | None, str]:
    """(HTTP status, S3 error code) of a client's response error; (None, "") for others."""
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        meta = response.get("ResponseMetadata") or {}
        code = str((response.get("Error") or {}).get("Code", ""))
        status = meta.get("HTTPStatusCode")
        return (status if isinstance(status, int) else None), code
    status = getattr(exc, "status", None)  # aiohttp ClientResponseError, wdsr's HttpStatusError
    return (status if isinstance(status, int) and not isinstance(status, bool) else None), ""


def _one_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, Unavailable):
        return True
    if isinstance(exc, (socket.gaierror, socket.herror)):  # DNS: the endpoint's name does not resolve (now)
        return True
    if isinstance(exc, OSError) and exc.errno in _NETWORK_ERRNOS:
        return True
    if _NETWORK & {c.__name__ for c in type(exc).__mro__}:
        return True
    status, code = _status(exc)
    return code in _BUSY_CODES or (status is not None and (status >= 500 or status in (408, 429)))


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from or while handling (s3fs re-raises a client's error under its own)."""
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not seen for seen in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it came from) means storage or the network is unavailable:
    unreachable, refused or reset connections, DNS failures, timeouts, throttling (SlowDown, 429) and
    5xx answers. Refused credentials, a missing bucket or object and local disk errors are not."""
    return any(_one_unavailable(e) for e in _chain(exc))


def exit_code_of(exc: BaseException, bad_input: tuple[type[BaseException], ...] = ()) -> ExitCode | None:
    """The exit code for an error that ends a command: UNAVAILABLE (see :func:`unavailable`); BAD_INPUT
    for a ``ValueError``, an ``OSError``, one of ``bad_input`` or an object-store client's refusal (no
    credentials, access denied, no such bucket); None for anything else: a crash, let it raise."""
    if unavailable(exc):
        return ExitCode.UNAVAILABLE
    if isinstance(exc, (ValueError, OSError, *bad_input)):
        return ExitCode.BAD_INPUT
    if any((type(e).__module__ or "").split(".")[0] in _CLIENTS for e in _chain(exc)):
        return ExitCode.BAD_INPUT
    return None
