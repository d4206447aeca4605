"""How the controller serves HTTP: uvicorn's httptools protocol on uvloop (its C parser and event loop; h11 and
asyncio when those are missing), with TCP_NODELAY on every connection.

With `--workers`, uvicorn hands the listening socket to its worker processes, where it comes back with protocol
number 0; asyncio then does not recognise the accepted connections as TCP and leaves Nagle's algorithm on, and
every response waits for the client's delayed ACK (measured here: 48 ms per request with two workers, 5 ms with
one). Setting TCP_NODELAY ourselves makes the workers as fast as a single process.
"""

from __future__ import annotations

import asyncio
import socket
from contextlib import suppress
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class NoDelayH11Protocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        _nodelay(transport)
        super().connection_made(transport)


try:  # uvicorn's httptools protocol imports httptools at module level
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency; h11 is the fallback
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

if HttpToolsProtocol is not None:
    class NoDelayHttpToolsProtocol(HttpToolsProtocol):  # module level: `--workers` pickles it for each worker
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            _nodelay(transport)
            super().connection_made(transport)


def server_options() -> dict[str, Any]:
    """uvicorn's `http` and `loop` settings: the fastest that is installed ("auto" takes uvloop if present)."""
    http = NoDelayHttpToolsProtocol if HttpToolsProtocol is not None else NoDelayH11Protocol
    return {"http": http, "loop": "auto"}
