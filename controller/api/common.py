"""Helpers shared by the API routers: tenant-scoped lookups and transactional retries."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from fastapi import Request
from sqlalchemy import select
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
    return p.is_admin or p.tenant_id == tenant_id


def owned(s: Session, model: type[T], ident: str, p: Principal, kind: str, field: str | None = None) -> T:
    """The row if the caller may see it; otherwise 404, the same answer as for a row that does not exist,
    so one tenant cannot probe for another's resources."""
    obj = s.get(model, ident)
    if obj is None or not visible(p, obj.tenant_id):  # type: ignore[attr-defined]
        raise not_found(kind, ident, field)
    return obj


def scoped(stmt, model, p: Principal):  # noqa: ANN001, ANN201
    return stmt if p.is_admin else stmt.where(model.tenant_id == p.tenant_id)


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
