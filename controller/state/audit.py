"""The audit log: every committed write through the API, who made it, and the revision it made.

The request's middleware says who and what (`CURRENT`, a context variable the handler's thread inherits); the
write's own transaction adds the entry after its revision stamp (`Database.write`), reading the revision from
the counter it has just moved, so an entry exists exactly when its write does."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from sqlalchemy import BigInteger, DateTime, String, bindparam, literal_column, select

from controller.state import models as m

CURRENT: ContextVar[dict[str, Any] | None] = ContextVar("tianji_audit", default=None)

_A, _C = m.AuditEntry.__table__, m.Counter.__table__
INSERT_ENTRY = _A.insert().from_select(
    ["at", "actor_kind", "actor", "tenant_id", "method", "path", "revision"],
    select(bindparam("at", type_=DateTime(timezone=True)), bindparam("actor_kind", type_=String),
           bindparam("actor", type_=String), bindparam("tenant_id", type_=String), bindparam("method", type_=String),
           bindparam("path", type_=String), _C.c.value.cast(BigInteger))
    .where(_C.c.name == literal_column("'revision'")))


def entry() -> dict[str, Any] | None:
    """This request's entry, stamped now, if it is one the log keeps."""
    e = CURRENT.get()
    return None if e is None else e | {"at": m.now()}
