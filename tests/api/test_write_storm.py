"""Concurrent writes: a storm of every kind of write from several tenants (several threads each), an orchestrator
binding ports and the admin rewriting quotas and hosts, on each backend. No answer is a 5xx, every acknowledged
write is there afterwards (and every acknowledged delete gone), and the storm's rate of acknowledged writes is
within 2x of one writer's running the same mix alone (before the lock order, PostgreSQL deadlocked: 500s, and
a tenth of one writer's rate). Also: the lock order is enforced, and a deadlock that happens anyway is retried."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import text, update

from controller.api.common import WriteRoute, retrying
from controller.state import models as m
from controller.state.db import Database, TenantNotLocked
from tests.conftest import backends, pg_wanted, served
from tests.support.controller import PgDatabase
from tests.support.storm import storm, verify

SECONDS = 8.0


@pytest.mark.parametrize("backend", backends())
def test_a_storm_of_writes_has_no_5xx_loses_nothing_and_keeps_pace(backend: str, tmp_path: Path) -> None:
    with served(backend, tmp_path, rate_limit=0) as c:
        single = storm(c.url, c.admin_token, SECONDS, tenants=1, workers_per_tenant=1, orchestrator=False,
                       admin=False, seed=1)
        many = storm(c.url, c.admin_token, SECONDS, tenants=3, workers_per_tenant=3, seed=2)
        for out in (single, many):
            assert not out.server_errors, "\n".join(out.server_errors[:10])
            assert not (wrong := verify(c.url, c.admin_token, out)), "\n".join(wrong[:10])
        # every kind of write happened, and the contended ones too (a subnet deleted while ports are made in it)
        assert {"port_create", "port_bulk", "subnet_create", "subnet_delete", "vpc_create", "sg_create",
                "rule_create", "port_bind", "quota_update", "host_register", "eip_create",
                "lb_create"} <= set(many.by_op)
        print(f"{backend}: one writer {single.rate:.1f} writes/s, storm {many.rate:.1f} writes/s "
              f"({dict(many.statuses)})")
        assert many.rate >= single.rate / 2, (single.rate, many.rate)


def test_a_tenants_rows_changed_without_its_lock_are_refused(tmp_path: Path) -> None:
    """The lock order cannot be forgotten: a write that changes a tenant's rows without naming the tenant to
    Database.write fails (in every test that drives it), instead of deadlocking under load in production."""
    db = Database(f"sqlite:///{tmp_path / 't.db'}")
    db.migrate()
    with db.write() as t:
        t.session.add(m.Tenant(id="t1", name="a"))
    with pytest.raises(TenantNotLocked), db.write() as t:
        t.session.add(m.Vpc(tenant_id="t1", name="v", cidr="10.0.0.0/16", vni=5, router_mac="02:00:00:00:00:05"))
    with db.write(tenants=["t1"]) as t:  # named: fine
        t.session.add(m.Vpc(tenant_id="t1", name="v", cidr="10.0.0.0/16", vni=5, router_mac="02:00:00:00:00:05"))
    from controller.api import quotas

    with pytest.raises(TenantNotLocked), db.write() as t:
        quotas.check(t.session, {r: -1 for r in quotas.RESOURCES}, "t1", "vpcs")


def test_every_write_route_retries_lost_races(tmp_path: Path) -> None:
    with served("sqlite", tmp_path) as c:
        def routes(rs: list) -> list:  # FastAPI keeps an included router's routes in it
            return [x for r in rs for x in (routes(r.original_router.routes) if hasattr(r, "original_router")
                                            else [r])]

        writes = [r for r in routes(c.app.routes) if set(getattr(r, "methods", None) or ()) - {"GET", "HEAD"}]
        assert len(writes) > 40
        unwrapped = [r.path for r in writes if not isinstance(r, WriteRoute)
                     or getattr(r.endpoint, "__wrapped__", None) is None]
        assert not unwrapped, f"write routes without the deadlock retry: {unwrapped}"


@pytest.mark.skipif(not pg_wanted(), reason="PostgreSQL half disabled (TIANJI_TEST_PG=0)")
def test_a_real_deadlock_is_retried_not_answered_500() -> None:
    """Two transactions that lock two rows in opposite orders: PostgreSQL kills one (deadlock_detected); run under
    `retrying`, as every write route is, the killed one runs again and both complete."""
    pg = PgDatabase()
    db = Database(pg.url)
    try:
        db.migrate()
        with db.engine.begin() as conn:
            conn.execute(text("SET LOCAL deadlock_timeout = '50ms'"))
            conn.execute(m.Counter.__table__.insert(), [{"name": "a", "value": 0}, {"name": "b", "value": 0}])
        barrier = threading.Barrier(2)
        attempts: list[str] = []

        def body(first: str, second: str) -> str:
            attempts.append(first)
            with db.engine.begin() as conn:
                conn.execute(text("SET LOCAL deadlock_timeout = '50ms'"))
                c = m.Counter.__table__
                conn.execute(update(c).where(c.c.name == first).values(value=c.c.value + 1))
                if len(attempts) <= 2:
                    barrier.wait(5)  # both hold their first row: each now waits for the other's
                conn.execute(update(c).where(c.c.name == second).values(value=c.c.value + 1))
            return first

        results, errors = [], []

        def run(first: str, second: str) -> None:
            try:
                results.append(retrying(body)(first, second))
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=ab) for ab in (("a", "b"), ("b", "a"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert sorted(results) == ["a", "b"]
        assert len(attempts) == 3  # one of the two was killed once and ran again
        with db.engine.connect() as conn:
            assert dict(conn.execute(text("SELECT name, value FROM counters WHERE name IN ('a', 'b')")).all()) \
                == {"a": 2, "b": 2}
    finally:
        db.engine.dispose()
        pg.drop()
