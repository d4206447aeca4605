"""The one client of the southbound API: what a hypervisor's agent and a gateway instance say to the controller.

`call` is a request (registration, heartbeats, reports); `watch` is the long-poll loop both run: it asks for what
changed after what the caller holds (`params`), hands each answer to `apply` as the caller's delta model, and on
any error (the controller away, an answer that does not parse) says so to `errors`, waits and asks again from
what is still held, never from scratch. One error type, `SouthboundError`, whatever went wrong on the way.
On httpx: kept-alive connections (a new connection per poll cost milliseconds per change), the long-poll on a
client of its own so that a beat never waits behind it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
POLL_S = 25  # how long the controller holds a watch without news
RETRY_S = 1.0  # the wait after a failed poll


class SouthboundError(Exception):
    """A request to the controller failed: `status` is its HTTP status, 0 when the controller was not reached."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}" if status else detail)
        self.status, self.detail = status, detail


@dataclass
class Answer:
    status: int
    body: bytes
    headers: Mapping[str, str]  # case-insensitive, as HTTP header names are (servers send them in any case)


class Southbound:
    def __init__(self, url: str, token: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self._poller = httpx.Client(base_url=self.url, headers=headers, timeout=POLL_S + 15)

    def call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """The answer parsed as JSON (None for 304 or an empty body)."""
        try:
            r = self.http.request(method, path, json=body, **({"timeout": timeout} if timeout else {}))
        except httpx.HTTPError as e:
            raise SouthboundError(0, f"{method} {path}: {type(e).__name__}: {e}") from None
        if r.status_code == 304:
            return None
        if r.status_code >= 400:
            raise SouthboundError(r.status_code, _detail(r))
        return r.json() if r.content else None

    def poll(self, path: str, params: Mapping[str, Any] | None = None) -> Answer:
        """One long-poll GET (200 or 304; anything else raises SouthboundError)."""
        try:
            r = self._poller.get(path, params={**(params or {})})
        except httpx.HTTPError as e:
            raise SouthboundError(0, f"GET {path}: {type(e).__name__}: {e}") from None
        if r.status_code not in (200, 304):
            raise SouthboundError(r.status_code, _detail(r))
        return Answer(r.status_code, r.content, r.headers)

    def watch(self, path: str, model: type[M], params: Callable[[], Mapping[str, Any]],
              apply: Callable[[M, Answer], None], errors: Callable[[Exception], None] | None = None,
              stop: threading.Event | None = None) -> None:
        """Until `stop`: poll `path` with `params()` (what the caller holds: `after`, a digest) and the long-poll
        timeout; hand a 200's body, parsed as `model` straight from the bytes (a whole config at 20,000 ports is
        10 MB), to `apply`. An error goes to `errors` (else the log), then the same question again after a second:
        the caller keeps what it holds, and so asks from there."""
        while stop is None or not stop.is_set():
            try:
                got = self.poll(path, {**params(), "timeout": POLL_S})
                if got.status == 200 and got.body:
                    apply(model.model_validate_json(got.body), got)
            except Exception as e:  # keep watching through controller outages and bad answers
                (errors or (lambda x: log.warning("watch %s: %s", path, x)))(e)
                time.sleep(RETRY_S)

    def close(self) -> None:
        self.http.close()
        self._poller.close()

    def register(self, name: str, vtep_ip: str, kind: str, role: str | None = None) -> None:
        self.call("POST", "/v1/hosts", {"name": name, "vtep_ip": vtep_ip, "kind": kind}
                  | ({"role": role} if role else {}))

    def beat(self, name: str, report: dict[str, Any]) -> dict[str, Any] | None:
        """The heartbeat (with the ports' states, for a hypervisor); SouthboundError 404: the controller forgot
        us (a fresh database), register again."""
        return self.call("POST", f"/v1/hosts/{name}/status", report)


def _detail(r: httpx.Response) -> str:
    try:
        return str(r.json().get("detail") or r.text[:200])
    except ValueError:
        return r.text[:200]
