"""The plain HTTP client's pool against a server that closes idle kept-alive connections (uvicorn does after 5 s):
a request after a burst left several idle connections must not meet one closed connection after another."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tianji import plain_http
from tianji.plain_http import PlainClient

IDLE_CLOSE_S = 0.3


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept alive
    timeout = IDLE_CLOSE_S  # the server closes a connection idle this long

    def do_GET(self) -> None:
        time.sleep(0.05)  # long enough that a burst opens several connections
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_request_after_a_burst_and_a_pause_is_answered(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plain_http, "IDLE_REUSE_S", 10.0)  # as if the server kept them longer than it does
    client = PlainClient(server, {}, False, 5.0)
    with ThreadPoolExecutor(6) as pool:
        assert all(r.status_code == 200 for r in pool.map(lambda _: client.request("GET", "/"), range(12)))
    assert len(client._idle) > 2  # the burst left several idle connections
    time.sleep(IDLE_CLOSE_S * 3)  # the server closed them all
    for _ in range(3):  # one closed connection met, then a new one: never a second closed one
        assert client.request("GET", "/").json() == {"ok": True}
    client.close()


def test_an_idle_connection_older_than_the_servers_patience_is_not_reused(server: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plain_http, "IDLE_REUSE_S", IDLE_CLOSE_S / 3)
    client = PlainClient(server, {}, False, 5.0)
    client.request("GET", "/")
    old = client._idle[0][1]
    time.sleep(IDLE_CLOSE_S / 2)
    client.request("GET", "/")
    assert old not in [c for _, c in client._idle] and old.sock is None  # closed by us, not met closed
    client.close()
