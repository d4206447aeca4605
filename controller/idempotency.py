"""`Idempotency-Key` on creates (POST), as cloud APIs offer it: a client that did not hear the answer retries with
the same key and gets the first answer, not a second resource.

Per credential and key, kept for a day (KEEP_S): the request's hash and the answer (any status below 500: a
refused create is refused again the same way). A retry with another body is refused (422). A 5xx answer is not
kept, so the retry runs again.

Crash-safe by construction: the key is inserted in the transaction of the write the request makes
(`controller/state/idempotent_writes.py`, called by `Database.write`), with the path of the row that write created. So
the key and the change commit together or not at all, whichever process dies when:
  - before the commit: neither exists; the retry (on any replica) runs the create, once;
  - after the commit, before the answer is kept: the key says what was created, and the retry answers that
    resource as it is now (`idempotent-replayed: derived`), at once;
  - after: the retry gets the kept answer.
Two requests with one key at the same time: the second's write finds the key committed (its unique insert waits
for the first's transaction) and rolls back; it answers 409, and its retry gets the first answer. A request that
writes nothing (a refusal, a read-only POST) keeps its answer afterwards.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool

from controller import failpoints
from controller.errors import problem
from controller.guards import replay
from controller.state.idempotency_models import CLAIM, Claim, IdempotencyKey
from controller.state.table_base import now

HEADER = b"idempotency-key"
KEEP_S = 24 * 3600
_T = IdempotencyKey.__table__


class Idempotency:
    """ASGI middleware, inside the guard (which knows the credential and has read the body)."""

    def __init__(self, app: Callable[..., Awaitable[None]], state: Any) -> None:
        self.app, self.state = app, state
        self.swept = 0.0

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        key = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == HEADER), None) \
            if scope["type"] == "http" and scope["method"] == "POST" else None
        p = scope.get("state", {}).get("principal")
        if key is None or p is None:
            return await self.app(scope, receive, send)
        if not 1 <= len(key) <= 255 or "\x00" in key:
            return await problem(422, "Idempotency-Key: 1 to 255 characters", "Idempotency-Key")(scope, receive, send)
        body, receive = await _body(receive)
        digest = hashlib.sha256(b"%s %s\n%s" % (scope["method"].encode(), scope["path"].encode(), body)).hexdigest()
        known = await run_in_threadpool(self._known, p.key, key, digest)
        if known is not None:
            return await known(scope, receive, send)
        claim = Claim(p.key, key, digest, scope["path"])
        answer: dict[str, Any] = {"status": 500, "body": b""}

        async def keep(message: dict) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
            elif message["type"] == "http.response.body":
                answer["body"] += message.get("body", b"")
                if not message.get("more_body", False) and not claim.lost:  # kept before the client hears it
                    failpoints.point("idempotency.after-commit")
                    await run_in_threadpool(self._keep, claim, answer["status"], answer["body"])
                    failpoints.point("idempotency.after-answer")
            await send(message)

        token = CLAIM.set(claim)
        try:
            await self.app(scope, receive, keep)
        finally:
            CLAIM.reset(token)

    def _known(self, credential: str, key: str, digest: str) -> Any:
        """None: the key is new, the request runs; else the answer to give now."""
        self._sweep()
        with self.state.db.engine.connect() as c:
            row = c.execute(select(_T).where(_T.c.credential == credential, _T.c.key == key)).first()
        if row is None:
            return None
        if row.request != digest:
            return problem(422, "Idempotency-Key: already used for a different request (method, path or body); use "
                                "a new key", "Idempotency-Key")
        if row.status is not None:
            return _Replay(row.status, row.body or b"")
        return _Derived(self.app, row.resource)  # committed, its answer lost with the process that made it

    def _keep(self, claim: Claim, status: int, body: bytes) -> None:
        where = (_T.c.credential == claim.credential) & (_T.c.key == claim.key)
        with self.state.db.engine.begin() as c:
            if claim.taken:  # committed with the write (a 5xx after it is not kept: the retry derives the answer)
                if status < 500:
                    c.execute(update(_T).where(where).values(status=status, body=body))
            elif status < 500:  # nothing written (a refusal): kept unless a concurrent request's key is there
                try:
                    c.execute(insert(_T).values(credential=claim.credential, key=claim.key, request=claim.digest,
                                                created_at=now(), status=status, body=body))
                except IntegrityError:
                    pass

    def _sweep(self) -> None:
        if time.monotonic() - self.swept < 600:
            return
        self.swept = time.monotonic()
        with self.state.db.engine.begin() as c:
            c.execute(delete(_T).where(_T.c.created_at < now() - timedelta(seconds=KEEP_S)))


class _Derived:
    """The answer of a create whose process died between its commit and keeping its answer: the resource it made,
    read now (GET), with the create's status; an action (no row made) answers the resource it acted on."""

    def __init__(self, app: Callable[..., Awaitable[None]], resource: str | None) -> None:
        self.app, self.resource = app, resource

    async def __call__(self, scope: dict, _receive: Callable, send: Callable) -> None:
        path = self.resource or scope["path"].rstrip("/").rsplit("/", 1)[0]
        got: dict[str, Any] = {"status": 500, "body": b""}

        async def nothing() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def take(message: dict) -> None:
            if message["type"] == "http.response.start":
                got["status"] = message["status"]
            elif message["type"] == "http.response.body":
                got["body"] += message.get("body", b"")

        get = dict(scope, method="GET", path=path, raw_path=path.encode(), query_string=b"")
        await self.app(get, nothing, take)
        if got["status"] != 200:
            return await problem(409, f"a request with this Idempotency-Key made its change, but its answer was lost "
                                      f"and {path} answers {got['status']}: read what it made", "Idempotency-Key")(
                scope, _receive, send)
        status = 201 if self.resource else 200
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(got["body"])).encode()),
                                (b"idempotent-replayed", b"derived")]})
        await send({"type": "http.response.body", "body": got["body"]})


class _Replay:
    """The first answer again, marked as such."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body

    async def __call__(self, _scope: dict, _receive: Callable, send: Callable) -> None:
        kind = b"application/problem+json" if self.status >= 400 else b"application/json"
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", kind), (b"content-length", str(len(self.body)).encode()),
                                (b"idempotent-replayed", b"true")]})
        await send({"type": "http.response.body", "body": self.body})


def _aware(t: Any) -> Any:
    from datetime import UTC

    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)  # SQLite gives naive datetimes back


async def _body(receive: Callable) -> tuple[bytes, Callable]:
    chunks, more = [], True
    while more:
        m = await receive()
        chunks.append(m.get("body", b""))
        more = m.get("more_body", False)
    body = b"".join(chunks)
    return body, replay(body, receive)
