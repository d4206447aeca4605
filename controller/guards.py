"""What every /v1 request passes before a handler sees it, in this order, each answered as problem+json:

1. NUL characters in the path or the query: 422 (PostgreSQL refuses them in text; SQLite would store them).
2. A body declared larger than `max_body_bytes`: 413, before it is read.
3. Authentication: no token, or a wrong one, is 401 before the body is read. A source sending wrong tokens
   faster than `auth_fail_limit` a second (burst `auth_fail_burst`) gets 429 for every token it has not
   already proven, and so does a wrong token tried that often from anywhere. The source is the client's
   address, or the one a trusted proxy forwards (`trusted_proxies`; no other is believed), so clients behind a
   proxy are told apart when the proxy is declared.
   With `client_ca` (mutual TLS), a host's credential is refused (403) unless the connection's verified client
   certificate names that host.
4. The rate (`rate_limit` a second, burst `rate_burst`; the admin is exempt): per tenant, all its tokens
   together (a tenant cannot buy rate by minting tokens, which its `tokens` quota caps too); per credential
   for hosts and orchestrators. 429 with Retry-After.
5. The body, read whole up to the limit (413 beyond it, for a body sent without a length), then handed on.

Limits are per controller process: with N workers or replicas a client may get N times the rate.
A write by the admin, a tenant or an orchestrator is entered in the audit log (`controller.state.audit`)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool

from controller.auth import Principal, authenticate, cached_principal
from controller.errors import ApiError, problem
from controller.state import audit
from tianji.ratelimit import TokenBucket

WRITES = {"POST", "PUT", "PATCH", "DELETE"}
BODIES = {"POST", "PUT", "PATCH"}


class Buckets:
    """A token bucket per key (a credential, a source address)."""

    MAX_KEYS = 50_000  # beyond this, buckets that have refilled are forgotten (they would start full anyway)

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.state: dict[str, TokenBucket] = {}

    def empty(self, key: str) -> float:
        """Seconds until `key` has a token (0: it has one now)."""
        b = self.state.get(key)
        return 0.0 if b is None else b.wait(time.monotonic())

    def take(self, key: str) -> float:
        """Take a token of `key`'s: 0 if there was one, else the seconds until there is (nothing taken)."""
        now = time.monotonic()
        if len(self.state) > self.MAX_KEYS:
            self.state = {k: b for k, b in self.state.items() if b.level(now) < self.burst}
        b = self.state.get(key)
        if b is None:
            b = self.state[key] = TokenBucket(self.rate, self.burst, now)
        return b.take(now)


class Guard:
    def __init__(self, app: Callable[..., Awaitable[None]], state: Any) -> None:
        self.app, self.state = app, state
        s = state.settings
        self.max_body = s.max_body_bytes
        self.rates = Buckets(s.rate_limit, s.rate_burst) if s.rate_limit > 0 else None
        self.fails = Buckets(s.auth_fail_limit, s.auth_fail_burst) if s.auth_fail_limit > 0 else None
        self.host_certs = bool(s.client_ca)  # mutual TLS: a host's token works only with that host's certificate

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        try:
            p = await self._admit(scope)
            body = await self._body(scope, receive) if scope["method"] in BODIES else None
        except ApiError as e:
            headers = {"Retry-After": str(e.extra.pop("retry_after"))} if "retry_after" in e.extra else None
            resp = problem(e.status, e.detail, e.field, [{"field": e.field, "message": e.detail}] if e.field else None,
                           headers=headers, **e.extra)
            return await resp(scope, receive, send)
        scope.setdefault("state", {})["principal"] = p
        if body is not None:
            receive = replay(body, receive)
        token = None
        if scope["method"] in WRITES and p.kind != "host":  # hosts' beats and registrations are not the log's
            token = audit.CURRENT.set({"actor_kind": p.kind, "actor": p.name or p.kind, "tenant_id": p.tenant_id,
                                       "method": scope["method"], "path": scope["path"][:255]})
        try:
            await self.app(scope, receive, send)
        finally:
            if token is not None:
                audit.CURRENT.reset(token)

    async def _admit(self, scope: dict) -> Principal:
        if "\x00" in scope["path"]:  # the server has decoded %00
            raise ApiError(422, "path: NUL characters are not allowed", "path")
        for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True):
            if "\x00" in k or "\x00" in v:
                raise ApiError(422, f"{k.replace(chr(0), '')}: NUL characters are not allowed",
                               k.replace("\x00", "") or "query")
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            raise ApiError(413, f"the request body is larger than {self.max_body} bytes; send less (a bulk "
                                "request: fewer items per request)", max_bytes=self.max_body)
        auth = headers.get("authorization", b"").decode("latin-1")
        p = cached_principal(self.state, auth)
        if p is None:
            src = "addr:" + (scope.get("client") or ("?",))[0]
            tried = "cred:" + hashlib.sha256(auth.encode("latin-1", "replace")).hexdigest()[:32]
            if self.fails is not None:
                if wait := self.fails.empty(src):
                    raise ApiError(429, "too many failed authentications from this address; wait and retry",
                                   retry_after=max(1, round(wait)))
                if wait := self.fails.empty(tried):
                    raise ApiError(429, "this token failed authentication too often; check it, wait and retry",
                                   retry_after=max(1, round(wait)))
            try:
                p = await run_in_threadpool(authenticate, self.state, auth)
            except ApiError as e:
                if e.status == 401 and self.fails is not None:
                    self.fails.take(src)
                    self.fails.take(tried)
                raise
        if self.host_certs and p.kind == "host" and p.host not in scope.get("state", {}).get("tls_peer", ()):
            raise ApiError(403, f"host {p.host!r}'s credential must come with its certificate (mutual TLS: a "
                                f"certificate from the cluster's CA naming {p.host!r}); give the agent or gateway "
                                "--cert and --key", "certificate")
        if self.rates is not None and not p.is_admin and (wait := self.rates.take(rate_key(p))):
            raise ApiError(429, f"rate limit: at most {self.rates.rate:g} requests a second per "
                                f"{'tenant' if p.tenant_id else 'credential'} (bursts of {self.rates.burst}); "
                                "retry after the time in Retry-After", retry_after=max(1, round(wait)))
        return p

    async def _body(self, scope: dict, receive: Callable) -> bytes:
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                break
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise ApiError(413, f"the request body is larger than {self.max_body} bytes; send less",
                               max_bytes=self.max_body)
            chunks.append(chunk)
            if not msg.get("more_body"):
                break
        return b"".join(chunks)


def rate_key(p: Principal) -> str:
    """A tenant's tokens share one rate; other credentials have their own."""
    return f"tenant:{p.tenant_id}" if p.tenant_id else f"cred:{p.key}"


def replay(body: bytes, receive: Callable) -> Callable:
    """`receive` for the next layer: the body read already, then what the server says."""
    sent = False

    async def again() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then what the server says (a disconnect)

    return again
