"""The one client of the southbound API: what a hypervisor's agent and a gateway instance say to the controller.

`call` is a request on its own connection (registration, heartbeats). `poll` is a long-poll watch on one
connection kept alive across polls (a new connection per poll cost milliseconds per change); on any error the
connection is dropped, so the next poll starts afresh. Both answer 304 as (304, None); other HTTP errors raise.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message
from typing import Any


@dataclass
class Answer:
    status: int
    body: bytes
    headers: Message  # case-insensitive, as HTTP header names are (servers send them in any case)


class Southbound:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url.rstrip("/"), token
        self._parts = urllib.parse.urlsplit(self.url)
        self._conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
        """(status, the answer parsed as JSON)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                got = r.read()
                return r.status, json.loads(got) if got else None
        except urllib.error.HTTPError as e:
            if e.code == 304:
                return 304, None
            raise

    def poll(self, path: str, timeout: float = 40) -> Answer:
        """A long-poll GET on the kept-alive connection; non-2xx/304 answers raise RuntimeError."""
        try:
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._parts.hostname or "", self._parts.port or 80,
                                                        timeout=timeout)
            self._conn.request("GET", self._parts.path.rstrip("/") + path,
                               headers={"Authorization": f"Bearer {self.token}"})
            r = self._conn.getresponse()
            got = Answer(r.status, r.read(), r.headers)
        except Exception:
            self.close()
            raise
        if got.status not in (200, 304):
            self.close()
            raise RuntimeError(f"HTTP {got.status}: {got.body[:200]!r}")
        return got

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def register(self, name: str, vtep_ip: str, kind: str, role: str | None = None) -> None:
        self.call("POST", "/v1/hosts", {"name": name, "vtep_ip": vtep_ip, "kind": kind}
                  | ({"role": role} if role else {}))

    def beat(self, name: str, report: dict[str, Any]) -> dict[str, Any] | None:
        """The heartbeat (with the ports' states, for a hypervisor); HTTPError 404: the controller forgot us."""
        return self.call("POST", f"/v1/hosts/{name}/status", report)[1]
