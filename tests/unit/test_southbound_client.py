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


def test_a_dead_replica_is_skipped_at_once_and_the_watch_resumes_from_what_it_holds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two controllers, the first dead (nothing listens): every request lands on the second without an error to the
    caller, `current` says so, and the watch asks the second from the revision it held, never from scratch."""
    monkeypatch.setattr(southbound_client, "FAILOVER_JITTER_S", 0.0)
    stop = threading.Event()
    applied: list[int] = []
    held = {"after": 7}

    def answer(path: str) -> tuple:
        if "after=7" in path:
            return 200, b'{"base": 7, "revision": 8}', {}
        stop.set()
        return 304, b"", {}

    def apply(d: Delta, _a: Answer) -> None:
        applied.append(d.revision)
        held["after"] = d.revision

    with server(answer) as (url, seen):
        dead = "http://127.0.0.1:9"  # the discard port: connection refused
        moved: list[str] = []
        sb = Southbound(f"{dead},{url}", "t")
        sb.on_failover = moved.append
        assert sb.current == dead
        sb.watch("/v1/hosts/h/config/delta", Delta, lambda: dict(held), apply, None, stop)
        assert applied == [8] and sb.current == url and sb.failovers == 1 and moved == [url]
        assert [p.split("after=")[1].split("&")[0] for p, _, _ in seen] == ["7", "8"]
        sb.beat("h", {"ports": {}})  # the next request goes straight to the one that answered
        assert sb.failovers == 1


def test_a_5xx_moves_on_only_where_asking_again_is_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats and watches are idempotent: a 5xx from one replica is asked of the next. A tenant's create is not:
    only a request that never reached a controller is sent again."""
    monkeypatch.setattr(southbound_client, "FAILOVER_JITTER_S", 0.0)
    with server(lambda _p: (503, b'{"detail": "database away"}', {})) as (sick, sick_seen), \
            server(lambda _p: (200, b'{"ok": true}', {})) as (well, well_seen):
        sb = Southbound([sick, well], "t")
        assert sb.call("POST", "/v1/hosts/h/status", {}) == {"ok": True} and sb.current == well
        sb2 = Southbound([sick, well], "t")
        r = sb2.send("POST", "/v1/ports", idempotent=False, json={})
        assert r.status_code == 503 and sb2.current == sick
        assert len(well_seen) == 1  # the create was not repeated on the second replica
    with pytest.raises(SouthboundError) as e:
        Southbound("http://127.0.0.1:9,http://127.0.0.1:7", "t").call("GET", "/v1/x")
    assert e.value.status == 0 and "127.0.0.1:7" in str(e.value)  # the last one tried


def test_controller_urls_are_checked() -> None:
    from tianji.tls import split_urls

    assert split_urls(" https://a:1/ , https://b:2 ") == ["https://a:1", "https://b:2"]
    for bad in ("", " , ", "a:1", "ftp://x"):
        with pytest.raises(ValueError):
            split_urls(bad)


def test_a_stalled_replica_loses_the_watch_as_soon_as_a_beat_moves_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller that stops answering (SIGSTOP) holds the long-poll it has; a beat that times out there moves
    the client to the next replica, and the watch follows at once instead of waiting for its read timeout."""
    import time as _time

    monkeypatch.setattr(southbound_client, "FAILOVER_JITTER_S", 0.0)
    stop = threading.Event()
    applied: list[float] = []

    def stalled(_path: str) -> tuple:
        _time.sleep(8)
        return 304, b"", {}

    def alive(path: str) -> tuple:
        if "/config/delta" in path:
            return (200, b'{"base": 7, "revision": 8}', {}) if "after=7" in path else (304, b"", {})
        return 200, b"{}", {}

    with server(stalled) as (a, _), server(alive) as (b, _):
        sb = Southbound([a, b], "t")
        t0 = _time.monotonic()
        held = {"after": 7}

        def apply(d: Delta, _a: Answer) -> None:
            applied.append(_time.monotonic() - t0)
            held["after"] = d.revision
            stop.set()

        w = threading.Thread(target=sb.watch, args=("/v1/hosts/h/config/delta", Delta, lambda: dict(held), apply,
                                                    None, stop), daemon=True)
        w.start()
        _time.sleep(0.3)
        sb.beat("h", {"ports": {}}, timeout=0.3)  # times out on the stalled one, lands on the other
        w.join(5)
        assert sb.current == b and applied and applied[0] < 2.0


def test_the_last_replicas_5xx_is_the_answer_not_an_unreachable_controller() -> None:
    """With one controller (or the last of several) answering 5xx, the caller gets that answer: the CLI shows the
    controller's problem, not 'cannot reach the controller'."""
    from tianji.api_client import ApiFailure, Client

    with server(lambda _p: (500, b'{"detail": "the database is away", "status": 500}', {})) as (url, _):
        with pytest.raises(ApiFailure) as e:
            Client(url, "t").get("/v1/vpcs")
        assert e.value.status == 500 and e.value.detail == "the database is away"
        with pytest.raises(SouthboundError) as s:
            Southbound(url, "t").call("GET", "/v1/vpcs")
        assert s.value.status == 500
