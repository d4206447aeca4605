"""Set-based reads: `column IN (a list bound as one parameter)`, and several reads in one round trip.

`in_ids`: SQLAlchemy's expanding IN renders one placeholder per item, so the SQL text changes with the list's length:
PostgreSQL plans it again every time, and psycopg never prepares it (it prepares a text it has seen five
times). On PostgreSQL the list is one array parameter and the text is fixed: `col = ANY(%(ids)s)`. Elsewhere
(SQLite) it stays the expanding IN: SQLite plans in-process, so a changing text costs little, and it would not
drive an index lookup from a list bound as one JSON parameter.

`fetch_all`: a host's compile needs up to a dozen small reads, and under load each round trip costs far more than
the query (the thread waits for the answer, then for the GIL, behind every other request of the process). On
PostgreSQL they are sent together in psycopg's pipeline mode: one round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import JSON, Boolean, String, bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import TypeDecorator, TypeEngine


class IdList(TypeDecorator):
    """A list of string ids as one bound value: an array on PostgreSQL."""

    impl = String
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(ARRAY(String) if dialect.name == "postgresql" else String())

    def process_bind_param(self, value: Iterable[str] | None, dialect: Dialect) -> Any:
        if value is None:
            raise ValueError("an id list is required (an empty one matches nothing)")
        return list(value)


class InIds(ColumnElement[bool]):
    inherit_cache = True
    type = Boolean()
    # a predicate, like a comparison: without this SQLAlchemy wrote `... = 1` after it on SQLite (no native
    # boolean), and SQLite then searched no index with it
    _is_implicitly_boolean = True
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
def _expanding(element: InIds, compiler: Any, **kw: Any) -> str:
    # `IN (SELECT value FROM json_each(?))` was tried: SQLite scanned whole tables with it
    return compiler.process(element.column.in_(bindparam(element.param.key, expanding=True)), **kw)


def fetch_all(s: Session, reads: Sequence[tuple[Executable, Mapping[str, Any]]]) -> list[Sequence[Any]]:
    """The rows of each read (statement, parameters), in the session's transaction. On PostgreSQL they go in one
    round trip (psycopg's pipeline mode; rows are named tuples); elsewhere one after the other (SQLAlchemy rows).
    Both kinds of row unpack by position and read by column name."""
    bind = s.get_bind()
    if bind.dialect.name != "postgresql" or len(reads) < 2:
        return [s.execute(stmt, params).all() for stmt, params in reads]
    from psycopg.rows import namedtuple_row

    cursors = []
    with pipeline(s) as conn:
        for stmt, params in reads:
            cur = conn.cursor(row_factory=namedtuple_row)
            cur.execute(*driver_form(stmt, bind.dialect, params))
            cursors.append(cur)
    return [cur.fetchall() for cur in cursors]


@contextmanager
def pipeline(s: Session) -> Iterator[Any]:
    """PostgreSQL: the session's driver connection (psycopg), in the session's transaction, in pipeline mode:
    what is sent inside goes in one round trip. psycopg's errors come out as SQLAlchemy's (IntegrityError,
    OperationalError...): what callers catch, and retry on, whichever way a statement went."""
    import psycopg

    dialect = s.get_bind().dialect
    conn = s.connection().connection.driver_connection
    try:
        with conn.pipeline():
            yield conn
    except psycopg.Error as e:
        raise DBAPIError.instance(None, None, e, psycopg.Error, dialect=dialect) from e


# (id(statement), dialect) -> (statement, compiled, the bind processors of its typed parameters)
_COMPILED: dict[tuple[int, str], tuple[Executable, Any, list[tuple[str, Any]]]] = {}
_COMPILED_LOCK = threading.Lock()


def driver_form(stmt: Executable, dialect: Dialect, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The statement as the driver takes it (SQL text with its placeholders, compiled once per statement, which
    are built once at import), and its parameters with the statement's literals and id lists filled in."""
    key = (id(stmt), dialect.name)
    entry = _COMPILED.get(key)
    if entry is None or entry[0] is not stmt:
        with _COMPILED_LOCK:
            compiled = stmt.compile(dialect=dialect)
            # what the driver cannot take as it is (id lists, JSON), as SQLAlchemy's own execution would convert it
            procs = [(name, proc) for name, bp in compiled.binds.items()
                     if (proc := bp.type.bind_processor(dialect)) is not None
                     and isinstance(bp.type, IdList | JSON)]
            entry = _COMPILED[key] = (stmt, compiled, procs)
    compiled, procs = entry[1], entry[2]
    values = compiled.construct_params(dict(params))
    for name, proc in procs:
        if name in values:
            values[name] = proc(values[name])
    return compiled.string, values
