"""`column IN (a list bound as one parameter)`, for statements built once and run with lists of any length.

SQLAlchemy's expanding IN renders one placeholder per item, so the SQL text changes with the list's length:
PostgreSQL plans it again every time, and psycopg never prepares it (it prepares a text it has seen five
times). Bound as a single parameter the text is fixed: `col = ANY(%(ids)s)` with an array on PostgreSQL, and
`col IN (SELECT value FROM json_each(?))` with JSON text on SQLite.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Boolean, String, bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import TypeDecorator, TypeEngine


class IdList(TypeDecorator):
    """A list of string ids as one bound value: an array on PostgreSQL, JSON text elsewhere."""

    impl = String
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(ARRAY(String) if dialect.name == "postgresql" else String())

    def process_bind_param(self, value: Iterable[str] | None, dialect: Dialect) -> Any:
        if value is None:
            raise ValueError("an id list is required (an empty one matches nothing)")
        return list(value) if dialect.name == "postgresql" else json.dumps(list(value))


class InIds(ColumnElement[bool]):
    inherit_cache = True
    type = Boolean()
    _traverse_internals = [("column", InternalTraversal.dp_clauseelement),
                           ("param", InternalTraversal.dp_clauseelement)]

    def __init__(self, column: ColumnElement[Any], param: ColumnElement[Any]) -> None:
        self.column, self.param = column, param


def in_ids(column: ColumnElement[Any], name: str) -> InIds:
    """`column` is one of the ids bound to parameter `name` (a list, tuple or set of strings)."""
    return InIds(column, bindparam(name, type_=IdList()))


@compiles(InIds, "postgresql")
def _any(element: InIds, compiler: Any, **kw: Any) -> str:
    return f"{compiler.process(element.column, **kw)} = ANY({compiler.process(element.param, **kw)})"


@compiles(InIds)
def _json_each(element: InIds, compiler: Any, **kw: Any) -> str:
    return (f"{compiler.process(element.column, **kw)} IN "
            f"(SELECT value FROM json_each({compiler.process(element.param, **kw)}))")
