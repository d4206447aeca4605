"""`in_ids` selects what `IN (...)` selects, on both backends; on PostgreSQL with one SQL text for lists of every
length (so it can stay prepared)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event, select
from sqlalchemy.exc import StatementError

from controller.state import models as m
from controller.state.db import Database
from controller.state.sqlset import in_ids

HOSTS = [f"hv{i}" for i in range(12)] + ["with'quote", 'with"dq', "ünï"]
Q = select(m.Host.name).where(in_ids(m.Host.__table__.c.name, "names")).order_by(m.Host.name)


def test_in_ids_selects_what_in_selects(database: Database) -> None:
    db = database
    with db.write() as t:
        for i, h in enumerate(HOSTS):
            t.session.add(m.Host(name=h, vtep_ip=f"172.16.0.{i + 1}", kind="hypervisor", status="up",
                                 last_seen=m.now()))

    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.sampled_from([*HOSTS, "absent", ""]), max_size=20))
    def check(names: list[str]) -> None:
        with db.read() as s:
            got = list(s.execute(Q, {"names": names}).scalars())
            assert got == sorted(set(names) & set(HOSTS))
            # sets and tuples bind too
            assert list(s.execute(Q, {"names": set(names)}).scalars()) == got

    check()
    if db.is_postgres:
        assert "= ANY(" in str(Q.compile(dialect=db.engine.dialect))


def test_a_missing_list_never_matches_everything(database: Database) -> None:
    with database.write() as t:
        t.session.add(m.Host(name="hv1", vtep_ip="172.16.0.1", kind="hypervisor", status="up", last_seen=m.now()))
    with database.read() as s:
        try:  # an error on PostgreSQL (IdList refuses None), nothing on SQLite
            rows = s.execute(Q, {"names": None}).all()
        except StatementError:
            rows = []
        assert rows == []


def test_sqlite_searches_an_index_with_it(tmp_path: Path) -> None:
    """`in_ids` is a predicate, not a boolean value: SQLAlchemy once wrote `... = 1` after it on SQLite, and SQLite
    then scanned whole tables instead of searching their indexes (a compile took twice as long at 20,000 ports)."""
    db = Database(f"sqlite:///{tmp_path / 't.db'}")
    try:
        db.migrate()
        seen: list[tuple[str, tuple]] = []
        event.listen(db.engine, "before_cursor_execute",
                     lambda _c, _cur, stmt, params, _ctx, _many: seen.append((stmt, params)))
        ports = m.Port.__table__
        q = select(ports.c.id).where(in_ids(ports.c.vpc_id, "vpcs"))
        with db.read() as s:
            s.execute(q, {"vpcs": ["a", "b"]}).all()
            stmt, params = seen[-1]
            assert "= 1" not in stmt
            plan = " ".join(r[-1] for r in s.connection().exec_driver_sql("EXPLAIN QUERY PLAN " + stmt, params))
        assert "SEARCH ports USING INDEX ix_ports_vpc_id (vpc_id=?)" in plan, plan
    finally:
        db.engine.dispose()
