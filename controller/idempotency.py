"""`Idempotency-Key` on creates (POST), as cloud APIs offer it: a client that did not hear the answer retries with
the same key and gets the first answer, not a second resource.

Per credential and key, kept for a day (KEEP_S): the request's hash and, once it is answered, the answer (any
status below 500: a refused create is refused again the same way). A retry with another body is refused (422);
one that arrives while the first still runs waits for nothing: 409, retry later. A 5xx answer is not kept, so
the retry runs again. The key is claimed in its own transaction before the create runs, so two concurrent
requests with one key cannot both create.
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

from controller.errors import problem
from controller.guards import replay
from controller.idempotency_models import IdempotencyKey
from controller.table_base import now

HEADER = b"idempotency-key"
KEEP_S = 24 * 3600
STALE_S = 60.0  # a claim this old whose request never finished (a crash) may be taken over
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
        known = await run_in_threadpool(self._claim, p.key, key, digest)
        if known is not None:
            return await known(scope, receive, send)
        answer: dict[str, Any] = {"status": 500, "body": b"", "kept": False}

        async def keep(message: dict) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
            elif message["type"] == "http.response.body":
                answer["body"] += message.get("body", b"")
                if not message.get("more_body", False):  # kept before the client hears it: a retry finds it
                    answer["kept"] = True
                    await run_in_threadpool(self._settle, p.key, key, answer["status"], answer["body"])
            await send(message)

        try:
            await self.app(scope, receive, keep)
        finally:
            if not answer["kept"]:
                await run_in_threadpool(self._settle, p.key, key, 500, b"")

    def _claim(self, credential: str, key: str, digest: str) -> Any:
        """None: the key is ours to run with; else the answer to give now."""
        self._sweep()
        with self.state.db.engine.connect() as c:
            row = c.execute(select(_T).where(_T.c.credential == credential, _T.c.key == key)).first()
        if row is None:
            try:
                with self.state.db.engine.begin() as c:
                    c.execute(insert(_T).values(credential=credential, key=key, request=digest, created_at=now()))
                return None
            except IntegrityError:  # another request with this key claimed it meanwhile
                return problem(409, "a request with this Idempotency-Key is still running; retry later",
                               "Idempotency-Key")
        with self.state.db.engine.begin() as c:
            if row.request != digest:
                return problem(422, "Idempotency-Key: already used for a different request (method, path or "
                                    "body); use a new key", "Idempotency-Key")
            if row.status is None:
                if (now() - _aware(row.created_at)).total_seconds() < STALE_S:
                    return problem(409, "a request with this Idempotency-Key is still running; retry later",
                                   "Idempotency-Key")
                c.execute(update(_T).where(_T.c.credential == credential, _T.c.key == key).values(created_at=now()))
                return None
        return _Replay(row.status, row.body or b"")

    def _settle(self, credential: str, key: str, status: int, body: bytes) -> None:
        where = (_T.c.credential == credential) & (_T.c.key == key)
        with self.state.db.engine.begin() as c:
            if status >= 500:
                c.execute(delete(_T).where(where))
            else:
                c.execute(update(_T).where(where).values(status=status, body=body))

    def _sweep(self) -> None:
        if time.monotonic() - self.swept < 600:
            return
        self.swept = time.monotonic()
        with self.state.db.engine.begin() as c:
            c.execute(delete(_T).where(_T.c.created_at < now() - timedelta(seconds=KEEP_S)))


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
