"""A rolling upgrade's migration on PostgreSQL while the old replica serves (docs/operations.md, Upgrades): it meets
that replica's transactions, is rolled back whole when it cannot lock a table in time, and succeeds once it can;
the replica waits at most the lock timeout meanwhile, never on a migration queued behind it for good."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, inspect, text

from controller.state import schema
from tests.conftest import pg_wanted
from tests.support.controller import PgDatabase


def test_a_migration_held_off_by_a_serving_replica_is_tried_again(caplog) -> None:
    if not pg_wanted():
        pytest.skip("PostgreSQL only (TIANJI_TEST_PG=0)")
    db = PgDatabase()
    engine = create_engine(db.url)
    try:
        cfg = Config()
        cfg.set_main_option("script_location", str(schema.MIGRATIONS))
        with engine.begin() as conn:  # the previous release's schema
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0023")
        replica = engine.connect()
        tx = replica.begin()
        replica.execute(text("SELECT count(*) FROM subnets"))  # the old replica mid-transaction on a table 0024 alters
        release = threading.Timer(5.0, tx.rollback)
        release.start()
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="controller.state.db"):
            schema.upgrade(engine)
        took = time.monotonic() - t0
        release.join()
        replica.close()
        assert took >= 4.5  # it could not have the table before the replica let go
        assert any("trying again" in r.getMessage() for r in caplog.records)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == schema.head()
            assert "ipv6_cidr" in {c["name"] for c in inspect(conn).get_columns("subnets")}
    finally:
        engine.dispose()
        db.drop()
