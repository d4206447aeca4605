"""The southbound client's long-poll: one kept-alive connection, 304 as an answer, headers in any case."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tianji.southbound_client import Southbound


def test_poll_keeps_one_connection_and_reads_headers_in_any_case() -> None:
    seen: list[tuple[str, str, int]] = []

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # http.server's API
            seen.append((self.path, self.headers.get("Authorization", ""), self.client_address[1]))
            if self.path.endswith("after=1"):
                self.send_response(304)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            body = b'{"ok": 1}'
            self.send_response(200)
            self.send_header("x-tianji-config-digest", "abc")  # lowercase, as uvicorn sends it
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        sb = Southbound(f"http://127.0.0.1:{srv.server_port}", "tjh_x")
        a = sb.poll("/v1/x?after=0")
        assert (a.status, a.body, a.headers.get("X-Tianji-Config-Digest")) == (200, b'{"ok": 1}', "abc")
        assert sb.poll("/v1/x?after=1").status == 304
        assert len({port for _, _, port in seen}) == 1  # the same connection both times
        assert all(auth == "Bearer tjh_x" for _, auth, _ in seen)
    finally:
        srv.shutdown()
