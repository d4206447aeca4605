"""Helpers shared by the API routers: tenant-scoped lookups, the tenants a write locks, and transactional
retries (`WriteRoute`: every write route re-runs its handler on a deadlock or serialization failure)."""

from __future__ import annotations

import functools
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Query, Request, Response
from fastapi.routing import APIRoute
from sqlalchemy import exists, func, select, tuple_
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from controller.auth import Principal
from controller.errors import ApiError, not_found
from controller.state import models as m
from controller.state.db import Database

log = logging.getLogger(__name__)
T = TypeVar("T")
ATTEMPTS = 6


def db_of(request: Request) -> Database:
    return request.app.state.db


def visible(p: Principal, tenant_id: str) -> bool:
    return p.sees_all or p.tenant_id == tenant_id


def owned(s: Session, model: type[T], ident: str, p: Principal, kind: str, field: str | None = None,
          tenant: str | None = None) -> T:
    """The row if the caller may see it (and, with `tenant`, if it is that tenant's: a reference from one of its
    resources, which may never cross tenants, whoever asks, the admin included); otherwise 404, the same answer
    as for a row that does not exist, so one tenant cannot probe for another's resources."""
    obj = s.get(model, ident)
    if obj is None or not visible(p, obj.tenant_id) or \
            tenant is not None and obj.tenant_id != tenant:  # type: ignore[attr-defined]
        raise not_found(kind, ident, field)
    return obj


def scoped(stmt, model, p: Principal):
    return stmt if p.sees_all else stmt.where(model.tenant_id == p.tenant_id)


def with_retries(fn: Callable[[], T], what: str) -> T:
    """Run a whole transaction, again if a concurrent writer won a unique constraint race.
    The body recomputes its allocation each time, so a retry picks a fresh IP/MAC/VNI. (Deadlocks and
    serialization failures are the route's to retry: `WriteRoute`.)"""
    for attempt in range(ATTEMPTS):
        try:
            return fn()
        except IntegrityError as e:
            if attempt == ATTEMPTS - 1:
                log.warning("giving up on %s after %d attempts: %s", what, ATTEMPTS, e.orig)
                raise ApiError(409, f"{what} conflicted with concurrent changes; retry the request") from None
    raise AssertionError("unreachable")


# PostgreSQL's serialization_failure, deadlock_detected, lock_not_available: the transaction lost a race and was
# rolled back whole; the same request run again is expected to succeed
RETRY_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
WRITE_ATTEMPTS = 8
WRITE_BACKOFF_S = (0.005, 0.4)  # the first retry's mean wait, and the cap (exponential, full jitter)


def retryable(e: BaseException) -> bool:
    """A database error that a fresh transaction may not meet: a lost race, a lock wait given up, a connection
    that died (the pool replaces it), SQLite's busy database."""
    if not isinstance(e, DBAPIError) or isinstance(e, IntegrityError):
        return False
    return (getattr(e.orig, "sqlstate", None) in RETRY_SQLSTATES or e.connection_invalidated
            or "database is locked" in str(e.orig))


def retrying(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` (a write route's handler: all it changes is in its transaction) run again, with jittered exponential
    backoff, when its transaction lost a race; after WRITE_ATTEMPTS, 503 with Retry-After, never a 500."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        for attempt in range(WRITE_ATTEMPTS):
            try:
                return fn(*args, **kwargs)
            except DBAPIError as e:
                if not retryable(e):
                    raise
                if attempt == WRITE_ATTEMPTS - 1:
                    log.warning("%s: giving up after %d attempts: %s", fn.__name__, WRITE_ATTEMPTS,
                                str(e.orig).splitlines()[0])
                    raise ApiError(503, "the database was too busy to complete this write (it kept conflicting "
                                        "with concurrent writes); nothing was changed: retry the request",
                                   headers={"Retry-After": "1"}) from None
                log.info("%s: retrying (%d) after %s", fn.__name__, attempt + 1, type(e.orig).__name__)
                time.sleep(random.uniform(0, min(WRITE_BACKOFF_S[1], WRITE_BACKOFF_S[0] * 2 ** attempt * 2)))
        raise AssertionError("unreachable")

    return run


def one_hop(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """A hot write route's handler (a plain function, its transaction retried by `retrying`) as a coroutine that
    runs it in the thread pool: one thread hop per request, where FastAPI takes two for a plain handler (the
    handler, then its answer's validation). For the routes every host calls every few seconds."""
    retried = retrying(fn)

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> T:
        return await run_in_threadpool(retried, *args, **kwargs)

    return run


class WriteRoute(APIRoute):
    """Every route of the API: a write's handler (POST, PUT, PATCH, DELETE; a plain function, run in the thread
    pool) is wrapped by `retrying`, so no handler can forget to retry a deadlock."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        if set(kwargs.get("methods") or ()) - {"GET", "HEAD", "OPTIONS"} and not inspect.iscoroutinefunction(endpoint):
            endpoint = retrying(endpoint)
        super().__init__(path, endpoint, **kwargs)


def tenant_of(p: Principal, model: Any, ident: Any) -> Callable[[Session], list[str | None]]:
    """For `Database.write(tenants=...)`: the tenant whose rows a write on `model` row `ident` changes. A tenant
    changes only its own (another's row is the body's 404), so its own id; for the admin and orchestrators, the
    row's tenant, read before the locks."""
    if not p.sees_all:
        return lambda _s: [p.tenant_id]
    return lambda s: [s.execute(select(model.tenant_id).where(model.id == ident)).scalar()]


def default_group_id(s: Session, vpc_id: str) -> str | None:
    return s.execute(
        select(m.SecurityGroup.id).where(m.SecurityGroup.vpc_id == vpc_id, m.SecurityGroup.is_default.is_(True))
    ).scalar_one_or_none()


# --- pagination (Neutron style: `limit`, and `marker`, the id of the last item of the previous page) -------------
PAGE_DEFAULT, PAGE_MAX = 1000, 10_000
MAX_INT, MAX_BIGINT = 2**31 - 1, 2**63 - 1  # the columns' ranges (Integer, BigInteger) bound the API's integers


@dataclass
class Page:
    limit: int = Query(PAGE_DEFAULT, ge=1, le=PAGE_MAX, description="items per page")
    marker: str | None = Query(None, max_length=64, description="the id of the last item of the previous page")
    name: str | None = Query(None, max_length=64, description="only those with this name (resources with names)")
    tag: str | None = Query(None, max_length=64, description="only those with this tag (VPCs, subnets, ports, "
                                                              "security groups)")


def paged(s: Session, stmt: Any, model: Any, keys: list[Any], page: Page, p: Principal, request: Request,
          response: Response) -> list:
    """One page of `stmt` (already scoped to what the caller may see), in the order of `keys` then id. When more
    follow, the response says where the next page starts: `Link: <...>; rel="next"` and `X-Next-Marker`."""
    id_col = model.id
    if page.name is not None:
        if not hasattr(model, "name"):
            raise ApiError(422, f"name: {model.__tablename__} have no names to filter on", "name")
        stmt = stmt.where(model.name == page.name)
    if page.tag is not None:
        if not hasattr(model, "tags"):
            raise ApiError(422, f"tag: {model.__tablename__} have no tags to filter on", "tag")
        stmt = stmt.where(has_tag(s, model.tags, page.tag))
    if page.marker is not None:
        marker: Any = page.marker
        if id_col.type.python_type is int:
            if not (marker.isascii() and marker.isdigit()) or int(marker) > MAX_BIGINT:  # "²".isdigit()
                raise ApiError(404, f"marker {page.marker} not found", "marker")
            marker = int(marker)
        after = s.get(model, marker)
        tenant = getattr(after, "tenant_id", None)
        if after is None or (tenant is not None and not visible(p, tenant)):
            raise ApiError(404, f"marker {page.marker} not found", "marker")
        stmt = stmt.where(tuple_(*keys, id_col) > tuple_(*[getattr(after, k.key) for k in keys], after.id))
    rows = list(s.execute(stmt.order_by(*keys, id_col).limit(page.limit + 1)).scalars())
    if len(rows) > page.limit:
        rows = rows[:page.limit]
        nxt = str(rows[-1].id)
        url = request.url.include_query_params(limit=page.limit, marker=nxt)
        response.headers["Link"] = f'<{url}>; rel="next"'
        response.headers["X-Next-Marker"] = nxt
    return rows


def has_tag(s: Session, col: Any, tag: str) -> Any:
    """`col` (a JSON list) holds `tag`: JSON containment on PostgreSQL, json_each on SQLite."""
    if s.get_bind().dialect.name == "postgresql":
        return col.cast(JSONB).contains([tag])
    each = func.json_each(col).table_valued("value")
    return exists(select(1).select_from(each).where(each.c.value == tag))


def relabel(obj: Any, body: Any) -> None:
    """A PATCH's description and tags, those it gives."""
    fields = body.model_fields_set
    if "description" in fields and body.description is not None:
        obj.description = body.description
    if "tags" in fields and body.tags is not None:
        obj.tags = list(body.tags)


def rename(s: Session, obj: Any, new: str | None, scope: Any, taken: str) -> None:
    """A PATCH's new name, unique among `obj`'s siblings (`scope`: the column they share, as Subnet.vpc_id);
    `taken` says who already has one (409 on `name`)."""
    if not new or new == obj.name:
        return
    model = type(obj)
    if s.execute(select(model.id).where(scope == getattr(obj, scope.key), model.name == new)).first():
        raise ApiError(409, f"{taken} named {new!r}", "name")
    obj.name = new
