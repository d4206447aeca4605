"""A read snapshot is one: every statement of it sees the same committed state, on SQLite as on PostgreSQL (the
compiler relies on it: a config's revision must match its content)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from controller import models as m
from controller.db import Database
from tests.conftest import PgDatabase, backends


@pytest.mark.parametrize("backend", backends())
def test_snapshot_sees_one_state(backend: str, tmp_path: Path) -> None:
    pg = PgDatabase() if backend == "postgres" else None
    db = Database(pg.url if pg else f"sqlite:///{tmp_path / 't.db'}")
    try:
        db.migrate()
        rev = select(m.Counter.value).where(m.Counter.name == "revision")
        with db.snapshot() as s:
            before = s.execute(rev).scalar_one()
            with db.write():  # another connection commits a write meanwhile
                pass
            assert s.execute(rev).scalar_one() == before
        assert db.revision() == before + 1
    finally:
        db.engine.dispose()
        if pg:
            pg.drop()
