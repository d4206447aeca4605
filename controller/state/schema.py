"""The database's schema: brought to the code's head by Alembic's migrations (controller/state/migrations), one process
at a time (an advisory lock on PostgreSQL: replicas starting together), said in one line."""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

log = logging.getLogger("controller.state.db")
MIGRATIONS = Path(__file__).parent / "migrations"


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head() -> str:
    """The schema this code needs: the newest migration's revision."""
    from alembic.script import ScriptDirectory

    return str(ScriptDirectory.from_config(_config()).get_current_head())


def revisions() -> set[str]:
    """Every schema revision this code knows (a backup of one of them can be migrated to the head)."""
    from alembic.script import ScriptDirectory

    return {r.revision for r in ScriptDirectory.from_config(_config()).walk_revisions()}


MIGRATION_LOCK = 0x7469616E6A6901  # PostgreSQL advisory lock keys ("tianji" and a number)


MIGRATION_TRIES = 20
MIGRATION_LOCK_TIMEOUT = "2s"  # an ALTER waiting for its table queues every query behind it: a serving replica's too


def upgrade(engine: Engine) -> None:
    """The schema brought to the code's head, said in one line (alembic's own lines, one per migration, at DEBUG).
    On PostgreSQL another replica may serve meanwhile (a rolling upgrade): a migration that meets its transactions
    (a deadlock, or a table it could not lock within MIGRATION_LOCK_TIMEOUT) is rolled back whole and tried again."""
    if engine.dialect.name == "sqlite":
        return _upgrade(engine)
    for attempt in range(1, MIGRATION_TRIES + 1):
        try:
            return _upgrade(engine)
        except OperationalError as e:
            code = getattr(e.orig, "sqlstate", None)
            if code not in ("40P01", "55P03") or attempt == MIGRATION_TRIES:  # deadlock, lock not available
                raise
            log.warning("the schema migration met a serving replica's transactions (%s): rolled back, trying "
                        "again (%d of %d)", "a deadlock" if code == "40P01" else "a table held", attempt,
                        MIGRATION_TRIES)
            time.sleep(random.uniform(0.2, 1.0))


def _upgrade(engine: Engine) -> None:
    cfg = _config()
    sqlite = engine.dialect.name == "sqlite"
    alembic_log = logging.getLogger("alembic")
    if not alembic_log.isEnabledFor(logging.DEBUG):
        alembic_log.setLevel(logging.WARNING)
    with engine.connect() as conn:
        if sqlite:
            # SQLite alters a table by copying it and dropping the original; with foreign keys enforced, that
            # DROP would cascade-delete every row that refers to it (a tenant's VPCs, a port's memberships).
            # The pragma only takes effect outside a transaction, hence on the driver's connection, before BEGIN.
            conn.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                if not sqlite:  # replicas starting together: one migrates, the others then find the head
                    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
                    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_TIMEOUT}'")
                cfg.attributes["connection"] = conn
                before = _schema_revision(conn)
                command.upgrade(cfg, "head")
                after = _schema_revision(conn)
                if before != after:
                    log.info("database schema migrated from %s to %s", before or "empty", after)
                if sqlite and (broken := conn.exec_driver_sql("PRAGMA foreign_key_check").all()):
                    raise RuntimeError(f"migration left rows with dangling references: {broken[:5]}")
        finally:
            if sqlite:
                conn.connection.driver_connection.execute("PRAGMA foreign_keys=ON")


def _schema_revision(conn: Connection) -> str | None:
    if not inspect(conn).has_table("alembic_version"):  # an empty database (asked, not tried: a failed query
        return None  # would abort PostgreSQL's transaction, which holds the migration lock)
    return conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
