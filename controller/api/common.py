"""Helpers shared by the API routers: tenant-scoped lookups and transactional retries."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Query, Request, Response
from sqlalchemy import select, tuple_
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from controller import models as m
from controller.auth import Principal
from controller.db import Database
from controller.errors import ApiError, not_found

log = logging.getLogger(__name__)
T = TypeVar("T")
ATTEMPTS = 6


def db_of(request: Request) -> Database:
    return request.app.state.db


def visible(p: Principal, tenant_id: str) -> bool:
    return p.sees_all or p.tenant_id == tenant_id


def owned(s: Session, model: type[T], ident: str, p: Principal, kind: str, field: str | None = None) -> T:
    """The row if the caller may see it; otherwise 404, the same answer as for a row that does not exist,
    so one tenant cannot probe for another's resources."""
    obj = s.get(model, ident)
    if obj is None or not visible(p, obj.tenant_id):  # type: ignore[attr-defined]
        raise not_found(kind, ident, field)
    return obj


def scoped(stmt, model, p: Principal):
    return stmt if p.sees_all else stmt.where(model.tenant_id == p.tenant_id)


def with_retries(fn: Callable[[], T], what: str) -> T:
    """Run a whole transaction, again if a concurrent writer won a unique constraint race.
    The body recomputes its allocation each time, so a retry picks a fresh IP/MAC/VNI."""
    for attempt in range(ATTEMPTS):
        try:
            return fn()
        except IntegrityError as e:
            if attempt == ATTEMPTS - 1:
                log.warning("giving up on %s after %d attempts: %s", what, ATTEMPTS, e.orig)
                raise ApiError(409, f"{what} conflicted with concurrent changes; retry the request") from None
        except OperationalError as e:  # serialization failure / lock timeout
            if attempt == ATTEMPTS - 1:
                raise ApiError(503, f"{what} could not complete: database busy ({e.orig}); retry") from None
    raise AssertionError("unreachable")


def default_group_id(s: Session, vpc_id: str) -> str | None:
    return s.execute(
        select(m.SecurityGroup.id).where(m.SecurityGroup.vpc_id == vpc_id, m.SecurityGroup.is_default.is_(True))
    ).scalar_one_or_none()


# --- pagination (Neutron style: `limit`, and `marker`, the id of the last item of the previous page) -------------
PAGE_DEFAULT, PAGE_MAX = 1000, 10_000


@dataclass
class Page:
    limit: int = Query(PAGE_DEFAULT, ge=1, le=PAGE_MAX, description="items per page")
    marker: str | None = Query(None, max_length=64, description="the id of the last item of the previous page")


def paged(s: Session, stmt: Any, model: Any, keys: list[Any], page: Page, p: Principal, request: Request,
          response: Response) -> list:
    """One page of `stmt` (already scoped to what the caller may see), in the order of `keys` then id. When more
    follow, the response says where the next page starts: `Link: <...>; rel="next"` and `X-Next-Marker`."""
    id_col = model.id
    if page.marker is not None:
        marker: Any = page.marker
        if id_col.type.python_type is int:
            if not marker.isdigit():
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
