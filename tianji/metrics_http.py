"""The small HTTP server a host's component serves its Prometheus metrics on (agent, gateway instance):
`exposition()` is read at each scrape; 127.0.0.1 unless told otherwise. And every component's registry
(`registry()`): its own collectors beside the standard process metrics (`process_resident_memory_bytes`,
`process_cpu_seconds_total`, `process_open_fds`, `process_start_time_seconds`...)."""

from __future__ import annotations

from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector


def registry(*collectors: object) -> CollectorRegistry:
    """A registry with `collectors` and this process's standard metrics (read from /proc at each scrape)."""
    r = CollectorRegistry()
    ProcessCollector(registry=r)
    for c in collectors:
        r.register(c)  # type: ignore[arg-type]
    return r


def serve(exposition: Callable[[], bytes], port: int, address: str = "127.0.0.1") -> None:
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's API
            ok = self.path in ("/metrics", "/")
            body = exposition() if ok else b"not found\n"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_a: object) -> None:
            pass

    ThreadingHTTPServer((address, port), Metrics).serve_forever()
