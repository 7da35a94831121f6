"""A TCP proxy on 127.0.0.1 that sits between an S3 client and server and breaks things on demand.

Requests (client -> server) are parsed just enough to find where each one starts and ends, so a
fault can be aimed at the next GET responses:

- ``cut_after(n, times)``: the next ``times`` GET responses are cut (connection reset) after ``n``
  bytes of the response have been forwarded;
- ``hold(n, times)``: the next GET responses stop after ``n`` bytes until the test calls ``release()``
  (or clears or closes the proxy): the test decides when, by what it has seen happen, not by a delay;
- ``fail_503(times)``: the next GET requests are answered ``503 SlowDown`` without reaching the server;
- ``refuse()``: drop every open connection and refuse new ones (a dead server).

Tests read ``gets`` (GET requests forwarded) and ``faults`` (faults fired).
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from collections import Counter

_SLOWDOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
             b"<Message>Please reduce your request rate.</Message></Error>")


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._lock = threading.Lock()
        self._rules: list[tuple[str, int, float, bytes]] = []  # (kind, n, seconds, match), first match fires
        self.gets = 0
        self.paths: Counter[bytes] = Counter()  # GET request paths (query dropped)
        self.ranges: list[bytes] = []  # the Range header of every GET, in order
        self.faults = 0
        self._refusing = False
        self._conns: set[socket.socket] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        self._released = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- driving faults -------------------------------------------------------------------------
    def cut_after(self, n: int, times: int = 1, match: bytes = b"") -> None:
        self._add([("cut", n, 0.0, match)] * times)

    def hold(self, n: int, times: int = 1, match: bytes = b"") -> None:
        self._add([("hold", n, 0.0, match)] * times)

    def release(self) -> None:
        """Let every held response go on (a client that gave up on it has reconnected by then)."""
        self._released.set()

    def fail_503(self, times: int = 1, match: bytes = b"") -> None:
        self._add([("503", 0, 0.0, match)] * times)

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
        self._closed = True
        self.release()
        self.refuse()
        try:
            self._listener.close()
        except OSError:
            pass

    def _add(self, rules: list[tuple[str, int, float, bytes]]) -> None:
        with self._lock:
            self._rules.extend(rules)

    def _next_rule(self, request_line: bytes) -> tuple[str, int, float, bytes] | None:
        """The first armed rule whose ``match`` is in the request line (path and query)."""
        with self._lock:
            self.gets += 1
            self.paths[request_line.split(b" ")[1].split(b"?")[0]] += 1
            for i, rule in enumerate(self._rules):
                if rule[3] in request_line:
                    self.faults += 1
                    return self._rules.pop(i)
            return None

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
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._conns.update((client, server))
            conn = _Conn(self, client, server)
            threading.Thread(target=conn.upstream, daemon=True).start()
            threading.Thread(target=conn.downstream, daemon=True).start()


class _Conn:
    """One client connection: parses requests upstream, applies the armed fault downstream."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.down = 0  # response bytes forwarded so far on this connection
        self.fault: tuple[str, int, float, bytes] | None = None  # armed for the current response
        self.fault_at = 0
        self.cond = threading.Condition()

    def close(self) -> None:
        for s in (self.client, self.server):
            _reset(s)
        with self.proxy._lock:
            self.proxy._conns.difference_update((self.client, self.server))

    def upstream(self) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = self.client.recv(65536)
                    if not data:
                        return self.close()
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.split(b"\r\n")
                method = lines[0].split(b" ", 1)[0].upper()
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(b":")
                    headers[k.strip().lower()] = v.strip()
                if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
                    self._raw(head + b"\r\n\r\n" + buf)  # cannot frame it: pass the rest through
                    return
                length = int(headers.get(b"content-length", b"0") or 0)
                while len(buf) < length:
                    data = self.client.recv(65536)
                    if not data:
                        return self.close()
                    buf += data
                body, buf = buf[:length], buf[length:]
                if method == b"GET":
                    with self.proxy._lock:
                        self.proxy.ranges.append(headers.get(b"range", b""))
                rule = self.proxy._next_rule(lines[0]) if method == b"GET" else None
                if rule and rule[0] == "503":
                    self.client.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                                        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(_SLOWDOWN) + _SLOWDOWN)
                    time.sleep(0.05)
                    return self.close()
                with self.cond:
                    self.fault, self.fault_at = (rule, self.down + rule[1]) if rule else (None, 0)
                self.server.sendall(head + b"\r\n\r\n" + body)
        except OSError:
            self.close()

    def _raw(self, first: bytes) -> None:
        self.server.sendall(first)
        while True:
            data = self.client.recv(65536)
            if not data:
                return self.close()
            self.server.sendall(data)

    def downstream(self) -> None:
        try:
            while True:
                data = self.server.recv(65536)
                if not data:
                    return self.close()
                while data:
                    with self.cond:
                        fault, at = self.fault, self.fault_at
                    if fault is None or self.down + len(data) < at:
                        self.down += len(data)  # counted first: the client may answer at once
                        self.client.sendall(data)
                        break
                    head, data = data[: at - self.down], data[at - self.down :]
                    self.down += len(head)
                    self.client.sendall(head)
                    with self.cond:
                        self.fault = None
                    if fault[0] == "cut":
                        return self.close()
                    self.proxy._released.wait(120)  # hold until released, then carry on (the client may have given up)
        except OSError:
            self.close()


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
