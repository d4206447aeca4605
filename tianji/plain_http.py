"""HTTP/1.1 on the standard library, for a command's few requests: `tianji vpc list` waits for no pool, no HTTP/2
and no stream, and httpx with httpcore took 45 ms to import, a quarter of the command (bench/cli.py).

The part of httpx's surface the southbound client's `send` uses: `PlainClient.request(method, path, json=,
params=, timeout=)` answers a `PlainResponse` (`status_code`, case-insensitive `headers`, `content`, `text`,
`json()`, `reason_phrase`). Kept-alive connections, one per request in flight (a client may be shared by
threads: a long-poll in one, writes in another). A failure on the way is a `PlainHttpError`, `connect` when the
controller was never reached (the request may then be sent elsewhere whatever its method).
"""

from __future__ import annotations

import http.client
import json as jsonlib
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

# a kept-alive connection the server closed meanwhile fails at once with one of these, before any answer
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
# an idle connection older than this is closed, not reused: the controller (uvicorn) closes one after 5 s
IDLE_REUSE_S = 4.0


class PlainHttpError(Exception):
    def __init__(self, detail: str, connect: bool) -> None:
        super().__init__(detail)
        self.connect = connect  # never reached: nothing was sent


class PlainResponse:
    def __init__(self, status: int, reason: str, headers: http.client.HTTPMessage, content: bytes) -> None:
        self.status_code, self.reason_phrase, self.headers, self.content = status, reason, headers, content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content)


class PlainClient:
    def __init__(self, base_url: str, headers: Mapping[str, str], verify: ssl.SSLContext | bool,
                 timeout: float) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = u.scheme == "https"
        self.host, self.port = u.hostname, u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")
        self.headers = dict(headers)
        # the system's store takes 20 ms to load: only for an https URL given no context
        self.context = verify if isinstance(verify, ssl.SSLContext) else \
            ssl.create_default_context() if self.tls else None
        self.timeout = timeout
        self._idle: list[tuple[float, http.client.HTTPConnection]] = []  # (idle since, conn): none in flight
        self._lock = threading.Lock()

    def _connection(self, fresh: bool = False) -> http.client.HTTPConnection:
        """An idle connection young enough that the server still keeps it (the newest), or a new one. `fresh`:
        a new one, after a pooled one turned out closed (the others, as old, may be too)."""
        stale: list[http.client.HTTPConnection] = []
        conn = None
        with self._lock:
            if fresh:
                stale, self._idle = [c for _, c in self._idle], []
            oldest = time.monotonic() - IDLE_REUSE_S
            while self._idle and conn is None:
                since, c = self._idle.pop()
                if since >= oldest:
                    conn = c
                else:
                    stale.append(c)
        for c in stale:
            c.close()
        if conn is not None:
            return conn
        return http.client.HTTPSConnection(self.host, self.port, context=self.context) if self.tls \
            else http.client.HTTPConnection(self.host, self.port)

    def request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None,
                timeout: float | None = None, headers: Mapping[str, str] | None = None) -> PlainResponse:
        target = self.prefix + path + (f"?{urlencode(params, doseq=True)}" if params else "")
        body = None if json is None else jsonlib.dumps(json).encode()
        head = self.headers | (dict(headers) if headers else {}) | \
            ({"Content-Type": "application/json"} if body is not None else {})
        for attempt in (0, 1):
            conn = self._connection(fresh=attempt > 0)
            reused = conn.sock is not None
            conn.timeout = timeout or self.timeout
            try:
                if not reused:
                    conn.connect()
                else:
                    conn.sock.settimeout(conn.timeout)
            except (OSError, ssl.SSLError) as e:  # refused, unreachable, timed out, the certificate refused
                conn.close()
                raise PlainHttpError(f"{type(e).__name__}: {e}", connect=True) from None
            try:
                conn.request(method, target, body=body, headers=head)
                r = conn.getresponse()
                content = r.read()
            except STALE as e:
                conn.close()
                if reused and attempt == 0:  # the server closed the idle connection: a new one, once
                    continue
                raise PlainHttpError(f"{type(e).__name__}: {e}", connect=False) from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise PlainHttpError(f"{type(e).__name__}: {e}", connect=False) from None
            if r.will_close:
                conn.close()
            else:
                with self._lock:
                    self._idle.append((time.monotonic(), conn))
            return PlainResponse(r.status, r.reason, r.headers, content)
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for _, c in idle:
            c.close()
