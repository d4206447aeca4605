"""A small client for the Tianji API, used by the CLI, the agent tests and the demo: on the southbound client's
transport (TLS verified against TIANJI_CA or the system's store, several controllers tried in turn)."""

from __future__ import annotations

from typing import Any

from tianji.southbound_client import Southbound, SouthboundError
from tianji.tls import ClientTls
from tianjictl.config import CONFIG_FILE, ApiFailure, load_cli_config  # noqa: F401 -- re-exported


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 30.0, tls: ClientTls | None = None) -> None:
        self.transport = Southbound(url, token, timeout, tls)
        self.url, self.token = self.transport.url, token
        self._next: str | None = None  # the last answer's X-Next-Marker

    @property
    def http(self) -> Any:
        """The raw httpx client of the controller in use (tests send what the CLI would not)."""
        return self.transport.client(self.transport.url)

    def request(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        try:
            r = self.transport.send(method, path, idempotent=method in ("GET", "HEAD"), json=body,
                                    params={k: v for k, v in params.items() if v is not None})
        except SouthboundError as e:
            raise ApiFailure(0, f"cannot reach the controller at {', '.join(self.transport.urls)} ({e.detail}); is "
                                "`tianji controller serve` running, and are --url (TIANJI_URL) and --ca "
                                "(TIANJI_CA) right?") from None
        self._next = r.headers.get("x-next-marker")
        if r.status_code == 304:
            return None
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {"detail": r.text}
            raise ApiFailure(r.status_code, body.get("detail") or body.get("title") or r.reason_phrase,
                             body.get("field"), body)
        return r.json() if r.content else None

    def get(self, path: str, **params: Any) -> Any:
        """A list comes whole: its pages are followed (X-Next-Marker) unless `limit` or `marker` is given."""
        if "limit" in params or "marker" in params:
            return self.request("GET", path, **params)
        out = self.request("GET", path, **params)
        marker = self._next
        while marker and isinstance(out, list):
            out += self.request("GET", path, **params, marker=marker)
            marker = self._next
        return out

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)
