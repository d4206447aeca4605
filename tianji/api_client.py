"""The HTTP client of the tenant and operator API: the `tianji` command's, and the emulated cluster's, the tests' and
the benches'. On the southbound client's transport (TLS verified against TIANJI_CA or the system's store, several
controllers tried in turn), its requests on the standard library's HTTP (tianji/plain_http.py); imported only when
the first client is made, so that a command that makes none (`tianji --help`) loads no HTTP."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tianji.tls import ClientTls


class ApiFailure(Exception):
    """The controller refused (`status`, its `detail`, the `field` it names) or was not reached (status 0)."""

    def __init__(self, status: int, detail: str, field: str | None = None, body: Any = None) -> None:
        super().__init__(f"{status}: {detail}")
        self.status, self.detail, self.field, self.body = status, detail, field, body


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 30.0, tls: ClientTls | None = None) -> None:
        from tianji.southbound_client import Southbound

        self.transport = Southbound(url, token, timeout, tls, plain=True)
        self.url, self.token = self.transport.url, token
        self._next: str | None = None  # the last answer's X-Next-Marker
        self._timeout = timeout
        self._http: Any = None

    @property
    def http(self) -> Any:
        """An httpx client of the controller in use, with this token and TLS (tests send what the CLI would not)."""
        if self._http is None:
            import httpx

            self._http = httpx.Client(base_url=self.transport.url, verify=self.transport.verify,
                                      timeout=self._timeout,
                                      headers={"Authorization": f"Bearer {self.token}"} if self.token else {})
        return self._http

    def request(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        from tianji.southbound_client import SouthboundError

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
