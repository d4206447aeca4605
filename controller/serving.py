"""How the controller serves HTTP: uvicorn's httptools protocol on uvloop (its C parser and event loop; h11 and
asyncio when those are missing), with TCP_NODELAY on every connection.

With `--workers`, uvicorn hands the listening socket to its worker processes, where it comes back with protocol
number 0; asyncio then does not recognise the accepted connections as TCP and leaves Nagle's algorithm on, and
every response waits for the client's delayed ACK (measured here: 48 ms per request with two workers, 5 ms with
one). Setting TCP_NODELAY ourselves makes the workers as fast as a single process.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import weakref
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from controller.tls import peer_names

T = TypeVar("T")


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _with_peer(protocol: Any, transport: asyncio.BaseTransport) -> None:
    """In every request's `state` on this connection (uvicorn copies the protocol's app_state into each request's
    scope): the names in the client's verified certificate (`tls_peer`), and the connection's socket
    (`tcp_socket`: a config stream asks the kernel whether its host still acknowledges,
    controller/southbound/open_streams)."""
    extra: dict[str, Any] = {"tcp_socket": transport.get_extra_info("socket")}
    if transport.get_extra_info("sslcontext") is not None:
        extra["tls_peer"] = peer_names(transport.get_extra_info("peercert"))
    protocol.app_state = {**protocol.app_state, **extra}


class NoDelayH11Protocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        _nodelay(transport)
        super().connection_made(transport)
        _with_peer(self, transport)


try:  # uvicorn's httptools protocol imports httptools at module level
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency; h11 is the fallback
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

if HttpToolsProtocol is not None:
    class NoDelayHttpToolsProtocol(HttpToolsProtocol):  # module level: `--workers` pickles it for each worker
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            _nodelay(transport)
            super().connection_made(transport)
            _with_peer(self, transport)


def server_options(trusted_proxies: list[str] | None = None) -> dict[str, Any]:
    """uvicorn's settings: the fastest protocol and loop installed ("auto" takes uvloop if present); no `Server`
    header (what runs here is nobody's business); X-Forwarded-For believed only from `trusted_proxies`
    (TIANJI_TRUSTED_PROXIES), so that a client cannot pick the address its failed logins are counted against
    (uvicorn believes 127.0.0.1 by default)."""
    http = NoDelayHttpToolsProtocol if HttpToolsProtocol is not None else NoDelayH11Protocol
    # With --workers, uvicorn's supervisor kills a worker whose health-check thread has not answered in 5 s.
    # Under a saturating load that thread can wait that long for the GIL, and a busy worker was killed with its
    # requests (seen here: clients' connections reset mid-benchmark). A dead worker is still noticed at once.
    # no uvicorn access log: controller/telemetry.py logs each request once, with its id and credential
    return {"http": http, "loop": "auto", "timeout_worker_healthcheck": 120, "server_header": False,
            "access_log": False,
            "proxy_headers": bool(trusted_proxies), "forwarded_allow_ips": ",".join(trusted_proxies or []) or ""}


THREADS_PER_WORKER = 8


def limit_threads() -> None:
    """Blocking handlers (database work) run in at most THREADS_PER_WORKER threads per process; more requests wait
    in the event loop. Python threads share one GIL: the default 40 only made them fight for it (and starved
    the health check above), while 8 already overlap the database round trips."""
    import anyio.to_thread

    anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS_PER_WORKER


# Watches compile in threads of their own, never more than these at once per process: a thousand hosts' watches
# then queue behind each other, never in front of a tenant's create (which takes the default threads above).
WATCH_THREADS = 8
_watch_limiters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> its limiter


async def watch_thread(fn: Callable[[], T]) -> T:
    """`fn` (a watch's database work) in one of the watches' threads."""
    import anyio.to_thread

    loop = asyncio.get_running_loop()
    if (limiter := _watch_limiters.get(loop)) is None:
        limiter = _watch_limiters[loop] = anyio.CapacityLimiter(WATCH_THREADS)
    return await anyio.to_thread.run_sync(fn, limiter=limiter)


class Collector:
    """When the process collects its old garbage.

    A full collection stops the whole process: about 100 ms here once a worker holds the state of 20,000 ports
    (a second on a slow day), and CPython starts one every second or so under a stream of writes, which was most
    of the watch latency's long tail. So the objects that exist once the app has started (modules, classes,
    routes, the ORM's mappings) are frozen out of collection; the youngest generations are collected as usual (a
    few ms); and the old one here, from the liveness loop, when no write has arrived for a while (or at the latest
    every `most` seconds), instead of in the middle of someone's request. What survives a collection is frozen
    too, so the next one walks only what was made since: an idle controller walking its whole heap every two
    minutes was a fifth of its idle CPU. Every `whole` seconds, when writes pause (at the latest after twice
    that), the frozen heap is collected as well, for the cycles among survivors that became garbage since."""

    def __init__(self, idle_after: float = 1.0, least: float = 10.0, most: float = 120.0,
                 whole: float = 900.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_after, self.least, self.most, self.whole = idle_after, least, most, whole
        self.clock = clock
        self.last = self.last_whole = clock()

    def start(self) -> None:
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, 10, 1_000_000)  # generation 2: only from tick()

    def tick(self, last_write: float | None) -> bool:
        """Collect if it is time (the frozen heap too if that is due); True if it did."""
        now = self.clock()
        idle = last_write is None or now - last_write > self.idle_after
        fresh = last_write is not None and last_write > self.last  # written to since the last collection
        if now - self.last < (self.least if idle and fresh else self.most):
            return False
        if now - self.last_whole >= (self.whole if idle else 2 * self.whole):
            gc.unfreeze()
            self.last_whole = now
        gc.collect()
        gc.freeze()
        self.last = self.clock()
        return True


GC_GEN0_THRESHOLD = 5_000  # CPython's default is 700: fewer young collections, fewer objects aged into the old
