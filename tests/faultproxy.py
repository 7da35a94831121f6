"""A TCP proxy on 127.0.0.1 that sits between an S3 client and server and breaks things on demand.

Requests and responses are framed (Content-Length, chunked, HEAD, 1xx), so the proxy knows where
each exchange starts and ends, and a fault can be aimed at the next GET responses:

- ``cut_after(n, times)``: the next ``times`` GET responses are cut (connection reset) after ``n``
  bytes of the response (head included) have been forwarded;
- ``hold(n, times)``: the next GET responses stop after ``n`` bytes until the test calls ``release()``
  (or clears or closes the proxy): the test decides when, by what it has seen happen, not by a delay;
  ``wait_held(k)`` returns once ``k`` holds have fired;
- ``fail_503(times)``: the next GET requests are answered ``503 SlowDown`` without reaching the server;
- ``refuse()``: drop every open connection and refuse new ones (a dead server).
- ``first_byte_s``: every GET response is held this long before its head is forwarded: a distant
  store's first-byte latency, for benches (``bench.inplace``); tests leave it 0.

What tests read, so that they compare the client's retries with what really went wrong instead
of assuming a server that never falters:

- ``faults``: faults fired (injected);
- ``server_errors``: what the real server did wrong on its own: 5xx responses, and connections it
  closed or reset (mid-response, or idle ones a client may find dead on its next request). Each
  can cost a client at most one failed try; on a healthy server it stays 0;
- ``exchanges``: every GET in order (range start, fault, status, bytes of head and body forwarded);
  ``gets``, ``paths`` (GET paths, query dropped) and ``ranges`` (Range headers) summarise them.
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import threading
import time
from collections import Counter, deque

_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_Rule = tuple[str, int, bytes]  # (kind, n, match)


@dataclasses.dataclass
class Exchange:
    """One request and what the proxy forwarded of its response."""

    method: bytes
    target: bytes  # path and query
    range: bytes  # the Range header (b"" where there was none)
    fault: str | None = None  # the injected fault aimed at it: "cut", "hold", "503"
    fault_at: int = 0  # ... after this many response bytes
    status: int | None = None
    head: int = 0  # response head bytes forwarded
    body: int = 0  # response body bytes forwarded
    done: bool = False  # the whole response went to the client

    @property
    def range_start(self) -> int | None:
        """The first byte asked for (``bytes=N-...``), None without a Range header."""
        first = self.range[6:].split(b"-")[0] if self.range.startswith(b"bytes=") else b""
        return int(first) if first.isdigit() else None


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._lock = threading.Condition()
        self._rules: list[_Rule] = []  # first match fires
        self.exchanges: list[Exchange] = []  # GETs, in the order they came
        self.paths: Counter[bytes] = Counter()
        self.faults = 0
        self.server_errors = 0
        self.held = 0  # holds that fired so far
        self._generation = 0  # release() moves it on: holds that fired before let go
        self._refusing = False
        self._closed = False
        self.first_byte_s = 0.0  # latency model for benches (tests leave it 0)
        self._conns: set[socket.socket] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def gets(self) -> int:
        with self._lock:
            return len(self.exchanges)

    @property
    def ranges(self) -> list[bytes]:
        """The Range header of every GET, in order (b"" where there was none)."""
        with self._lock:
            return [e.range for e in self.exchanges]

    # -- driving faults -------------------------------------------------------------------------
    def cut_after(self, n: int, times: int = 1, match: bytes = b"") -> None:
        self._add([("cut", n, match)] * times)

    def hold(self, n: int, times: int = 1, match: bytes = b"") -> None:
        self._add([("hold", n, match)] * times)

    def fail_503(self, times: int = 1, match: bytes = b"") -> None:
        self._add([("503", 0, match)] * times)

    def release(self) -> None:
        """Let every response held so far go on (a client that gave up on it has reconnected by then)."""
        with self._lock:
            self._generation += 1
            self._lock.notify_all()

    def wait_held(self, n: int = 1, timeout: float = 120.0) -> None:
        """Until ``n`` holds have fired (a client is waiting on a held response); ``timeout`` only
        stops a test that would hang."""
        with self._lock:
            if not self._lock.wait_for(lambda: self.held >= n or self._closed, timeout):
                raise AssertionError(f"{self.held} of {n} holds fired in {timeout:.0f} s")

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self._refusing = False
        self.release()

    def pending(self) -> int:
        with self._lock:
            return len(self._rules)

    def refuse(self) -> None:
        with self._lock:
            self._refusing = True
            conns = list(self._conns)
        for c in conns:
            _reset(c)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self.refuse()
        try:
            self._listener.close()
        except OSError:
            pass

    def _add(self, rules: list[_Rule]) -> None:
        with self._lock:
            self._rules.extend(rules)

    def _start(self, ex: Exchange) -> None:
        """Record a GET; the first armed rule whose ``match`` is in its target fires on it."""
        with self._lock:
            self.exchanges.append(ex)
            self.paths[ex.target.split(b"?")[0]] += 1
            for i, (kind, n, match) in enumerate(self._rules):
                if match in ex.target:
                    self.faults += 1
                    del self._rules[i]
                    ex.fault, ex.fault_at = kind, n
                    return

    def _server_error(self) -> None:
        with self._lock:
            if not self._closed:
                self.server_errors += 1

    def _hold(self, conn: _Conn) -> None:
        with self._lock:
            self.held += 1
            self._lock.notify_all()
            gen = self._generation
            self._lock.wait_for(lambda: self._generation != gen or self._closed or conn.closed)

    # -- plumbing -------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing:
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=30)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._conns.update((client, server))
            conn = _Conn(self, client, server)
            threading.Thread(target=conn.upstream, daemon=True).start()
            threading.Thread(target=conn.downstream, daemon=True).start()


class _Stream:
    """Buffered reads from one socket: whole lines and heads, or pieces of a known length."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def until(self, marker: bytes) -> bytes | None:
        """Everything up to and including ``marker``; None at EOF."""
        while marker not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.buf += data
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def piece(self, n: int) -> bytes | None:
        """Up to ``n`` bytes (at least one); None at EOF."""
        if not self.buf:
            self.buf = self.sock.recv(65536)
            if not self.buf:
                return None
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def _parse_head(head: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower()] = v.strip()
    return lines[0], headers


def _body_kind(headers: dict[bytes, bytes]) -> tuple[str, int]:
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        return "chunked", 0
    if b"content-length" in headers:
        return "length", int(headers[b"content-length"])
    return "eof", 0


class _Conn:
    """One client connection: frames requests upstream and responses downstream, applies faults."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.pending: deque[Exchange] = deque()  # sent to the server, response not finished
        self.closed = False
        self.last_said_close = False  # the last response said "Connection: close"
        self.mid: Exchange | None = None  # the response being forwarded

    def close(self) -> None:
        with self.proxy._lock:
            if self.closed:
                return
            self.closed = True
            self.proxy._lock.notify_all()
            self.proxy._conns.difference_update((self.client, self.server))
        for s in (self.client, self.server):
            _reset(s)

    # -- client -> server -----------------------------------------------------------------------
    def upstream(self) -> None:
        src = _Stream(self.client)
        try:
            while True:
                head = src.until(b"\r\n\r\n")
                if head is None:
                    return self.close()
                line, headers = _parse_head(head)
                method, target = (line.split(b" ") + [b"", b""])[:2]
                ex = Exchange(method.upper(), target, headers.get(b"range", b""))
                if ex.method == b"GET":
                    self.proxy._start(ex)
                if ex.fault == "503":
                    return self._answer_503(ex)
                with self.proxy._lock:
                    self.pending.append(ex)
                self.server.sendall(head)
                kind, n = _body_kind(headers)
                if kind == "chunked":
                    if not _forward_chunked(src, self._to_server):
                        return self.close()
                elif kind == "length" and not _forward_length(src, n, self._to_server):
                    return self.close()
        except OSError:
            self.close()

    def _to_server(self, data: bytes) -> bool:
        self.server.sendall(data)
        return True

    def _answer_503(self, ex: Exchange) -> None:
        """Answer without the server and close the way a server does (FIN, not RST), so the client
        reads the 503 whenever it gets to it."""
        msg = b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(
            _SLOWDOWN
        )
        ex.status, ex.head, ex.body, ex.done = 503, len(msg), len(_SLOWDOWN), True
        try:
            self.client.sendall(msg + _SLOWDOWN)
            self.client.shutdown(socket.SHUT_WR)
            while self.client.recv(65536):  # until the client closes its end
                pass
        except OSError:
            pass
        self.close()

    # -- server -> client -----------------------------------------------------------------------
    def downstream(self) -> None:
        src = _Stream(self.server)
        try:
            while True:
                head = src.until(b"\r\n\r\n")
                if head is None:
                    return self._server_gone()
                line, headers = _parse_head(head)
                status = int(line.split(b" ")[1])
                self.last_said_close = b"close" in headers.get(b"connection", b"").lower() or line.startswith(b"HTTP/1.0")
                if 100 <= status < 200:  # interim (100 Continue): the real response follows
                    if not self._to_client(Exchange(b"", b"", b""), head, True):
                        return
                    continue
                with self.proxy._lock:
                    ex = self.pending.popleft() if self.pending else Exchange(b"?", b"", b"")
                    self.mid = ex
                ex.status = status
                if status >= 500:
                    self.proxy._server_error()
                if self.proxy.first_byte_s and ex.method == b"GET":
                    time.sleep(self.proxy.first_byte_s)
                send = self._sender(ex)
                if not send(head, head=True):
                    return
                kind, n = _body_kind(headers)
                if ex.method == b"HEAD" or status in (204, 304):
                    kind, n = "length", 0
                if kind == "chunked":
                    ok = _forward_chunked(src, send)
                elif kind == "length":
                    ok = _forward_length(src, n, send)
                else:  # the body ends when the server closes
                    while (data := src.piece(65536)) is not None:
                        if not send(data):
                            return
                    ex.done, self.mid = True, None
                    return self.close()
                if not ok:
                    return self._server_gone()
                ex.done, self.mid = True, None
        except OSError:  # reset by the server (the client's end fails in send, which closes first)
            self._server_gone()

    def _server_gone(self) -> None:
        """The server closed or reset the connection: its error if a response was owed or torn,
        or if it had not said it would close (the client may find that idle connection dead on
        its next request); not when we closed it (a cut, the client left, the proxy closed)."""
        with self.proxy._lock:
            ours = self.closed
            owed = bool(self.pending) or self.mid is not None  # a request unanswered, or a response torn
        if not ours and (owed or not self.last_said_close):
            self.proxy._server_error()
        self.close()

    def _sender(self, ex: Exchange):
        """``send(data)`` for ``ex``'s response: forwards, counts, and fires its fault at its byte."""
        at = ex.fault_at if ex.fault in ("cut", "hold") else None

        def send(data: bytes, head: bool = False) -> bool:
            nonlocal at
            sent = ex.head + ex.body
            if at is not None and sent + len(data) >= at:
                first, data = data[: at - sent], data[at - sent :]
                at = None
                if not self._to_client(ex, first, head):
                    return False
                if ex.fault == "cut":
                    self.close()
                    return False
                self.proxy._hold(self)
                if self.closed:
                    return False
            return self._to_client(ex, data, head)

        return send

    def _to_client(self, ex: Exchange, data: bytes, head: bool) -> bool:
        """Forward and count (counted first: the client may answer at once); False if the client left."""
        if head:
            ex.head += len(data)
        else:
            ex.body += len(data)
        try:
            self.client.sendall(data)
        except OSError:
            ex.head, ex.body = (ex.head - len(data), ex.body) if head else (ex.head, ex.body - len(data))
            self.close()
            return False
        return True


def _forward_length(src: _Stream, n: int, send) -> bool:
    while n > 0:
        data = src.piece(min(n, 65536))
        if data is None or not send(data):
            return False
        n -= len(data)
    return True


def _forward_chunked(src: _Stream, send) -> bool:
    """Forward a chunked body as it is (sizes, data, trailers); False if it ended early."""
    while True:
        line = src.until(b"\r\n")
        if line is None or not send(line):
            return False
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers, then the empty line
                line = src.until(b"\r\n")
                if line is None or not send(line):
                    return False
                if line == b"\r\n":
                    return True
        if not _forward_length(src, size + 2, send):
            return False


def _reset(s: socket.socket) -> None:
    """Drop the connection now (shutdown wakes the thread blocked on it; close then sends RST)."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
