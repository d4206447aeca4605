"""A read snapshot is one: every statement of it sees the same committed state, on SQLite as on PostgreSQL (the
compiler relies on it: a config's revision must match its content)."""

from __future__ import annotations

from sqlalchemy import select

from controller.state import models as m
from controller.state.db import Database


def test_snapshot_sees_one_state(database: Database) -> None:
    db = database
    rev = select(m.Counter.value).where(m.Counter.name == "revision")
    with db.snapshot() as s:
        before = s.execute(rev).scalar_one()
        with db.write():  # another connection commits a write meanwhile
            pass
        assert s.execute(rev).scalar_one() == before
    assert db.revision() == before + 1
