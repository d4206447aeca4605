"""The southbound client: the long-poll on one kept-alive connection, 304 as an answer, headers in any case; the one
watch loop both the agent and the gateways run keeps what the caller holds through errors and asks from there;
every failure is a SouthboundError."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import BaseModel

from tianji import southbound_client
from tianji.southbound_client import Answer, Southbound, SouthboundError


@contextmanager
def server(answer: Any) -> Iterator[tuple[str, list]]:
    """A controller stand-in: `answer(path) -> (status, body, headers)`; yields its URL and the requests seen."""
    seen: list[tuple[str, str, int]] = []

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # http.server's API
            seen.append((self.path, self.headers.get("Authorization", ""), self.client_address[1]))
            status, body, headers = answer(self.path)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *_a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}", seen
    finally:
        srv.shutdown()


def test_poll_keeps_one_connection_and_reads_headers_in_any_case() -> None:
    def answer(path: str) -> tuple:
        if path.endswith("after=1"):
            return 304, b"", {}
        return 200, b'{"ok": 1}', {"x-tianji-config-digest": "abc"}  # lowercase, as uvicorn sends it

    with server(answer) as (url, seen):
        sb = Southbound(url, "tjh_x")
        a = sb.poll("/v1/x", {"after": 0})
        assert (a.status, a.body, a.headers.get("X-Tianji-Config-Digest")) == (200, b'{"ok": 1}', "abc")
        assert sb.poll("/v1/x", {"after": 1}).status == 304
        assert len({port for _, _, port in seen}) == 1  # the same connection both times
        assert all(auth == "Bearer tjh_x" for _, auth, _ in seen)


class Delta(BaseModel):
    base: int
    revision: int


def test_the_watch_keeps_what_is_held_through_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(southbound_client, "RETRY_S", 0.01)
    script = iter([(200, b'{"base": -1, "revision": 5}'), (500, b'{"detail": "down for a moment"}'),
                   (200, b"not json"), (304, b""), (200, b'{"base": 5, "revision": 9}')])
    stop = threading.Event()
    held = {"after": -1}
    errors: list[Exception] = []
    applied: list[int] = []

    def answer(_path: str) -> tuple:
        try:
            status, body = next(script)
        except StopIteration:
            stop.set()
            return 304, b"", {}
        return status, body, {}

    def apply(d: Delta, a: Answer) -> None:
        assert a.status == 200
        applied.append(d.revision)
        held["after"] = d.revision

    with server(answer) as (url, seen):
        Southbound(url, "t").watch("/v1/hosts/h/config/delta", Delta, lambda: dict(held), apply, errors.append,
                                   stop)
    assert applied == [5, 9]
    assert [type(e).__name__ for e in errors] == ["SouthboundError", "ValidationError"]
    assert errors[0].status == 500 and "down for a moment" in str(errors[0])
    # after the errors it asked from revision 5, what it held, never from scratch again
    afters = [p.split("after=")[1].split("&")[0] for p, _, _ in seen]
    assert afters[:5] == ["-1", "5", "5", "5", "5"] and all("timeout=25" in p for p, _, _ in seen)


def test_every_failure_is_a_southbound_error() -> None:
    with server(lambda _p: (404, b'{"detail": "host hv1 not found"}', {})) as (url, _):
        with pytest.raises(SouthboundError) as e:
            Southbound(url, "t").beat("hv1", {"ports": {}})
        assert e.value.status == 404 and e.value.detail == "host hv1 not found"
    with pytest.raises(SouthboundError) as e:
        Southbound("http://127.0.0.1:9", "t").call("GET", "/v1/x")  # nothing listens on the discard port
    assert e.value.status == 0
