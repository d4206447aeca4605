"""Engine, sessions, migrations, and the write transaction that bumps the global revision.

Every write goes through `Database.write()`, which takes its locks in the one order every write path shares
(`LOCK ORDER` below), so concurrent writers queue and never deadlock; the revision order is the commit order.
Unique constraints still guard every allocation: the locks are an optimisation, not the guarantee.

LOCK ORDER (PostgreSQL; SQLite has one writer at a time and takes the same steps without row locks):
  1. the rows of the tenants whose resources the write changes, in id order (FOR NO KEY UPDATE, so a foreign
     key's check on them still passes): one tenant's writers queue here, different tenants' go on;
  2. the revision counter: right after the tenants (the write lock: one such writer at a time), or, for the
     `concurrent` writers (port creation), in the statement that stamps and commits;
  3. anything else the body touches (subnet rows while allocating, the VNI counter, hosts, ...).
`write(tenants=...)` takes 1 and 2 itself, before the body runs. A tenant's rows changed through the ORM, or a
quota checked, without that tenant's lock is refused as a programming error (`TenantNotLocked`), so a handler
that forgets fails its tests instead of deadlocking under load. A deadlock or serialization failure that still
happens (an operator's write that touches rows outside any tenant) is retried by the API (`api.common.retrying`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

from sqlalchemy import create_engine, delete, event, insert, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, UOWTransaction, sessionmaker
from sqlalchemy.sql import Executable

from controller.state import audit, change_log, schema, stamps
from controller.state import models as m
from controller.state.idempotent_writes import CLAIM, note_created_resource, take
from controller.state.stamps import CHANGES, STAMPED, ChangeSet, rows_affect

log = logging.getLogger(__name__)


# PostgreSQL's NOTIFY payload must stay under 8,000 bytes: past this, STAMP_NOTIFY sends a wake without detail
# ({"r": revision}) and every watch rechecks
NOTIFY_LIMIT = 7900
# PostgreSQL: stamp what a write touched with its revision and notify the other controller processes, in one
# statement built once. :bump is 1 for a writer that takes its revision here, right before the commit (see
# Database.write), and 0 for one that bumped first: the counter then hands back the revision it already holds.
STAMP_NOTIFY = text("""
    WITH c AS (UPDATE counters SET value = value + :bump WHERE name = 'revision' RETURNING value),
         v AS (UPDATE vpcs SET revision = (SELECT value FROM c) WHERE id = ANY(CAST(:vpcs AS varchar[]))),
         h AS (UPDATE hosts SET config_revision = CASE WHEN name = ANY(CAST(:hosts AS varchar[]))
                                                       THEN (SELECT value FROM c) ELSE config_revision END,
                                vtep_revision = CASE WHEN name = ANY(CAST(:vteps AS varchar[]))
                                                     THEN (SELECT value FROM c) ELSE vtep_revision END
               WHERE name = ANY(CAST(:hosts AS varchar[])) OR name = ANY(CAST(:vteps AS varchar[]))),
         t AS (UPDATE counters SET value = (SELECT value FROM c)
               WHERE name = 'topology' AND :topo OR name = 'vteps' AND :moved),
         back AS (DELETE FROM removed_hosts WHERE name = ANY(CAST(:vteps AS varchar[]))),
         gone AS (INSERT INTO removed_hosts (name, revision)
                  SELECT n, (SELECT value FROM c) FROM unnest(CAST(:removed AS varchar[])) n
                  ON CONFLICT (name) DO UPDATE SET revision = EXCLUDED.revision)
    SELECT value, pg_notify('tianji_revision', CASE WHEN length(d) < :limit THEN d
                                                    ELSE json_build_object('r', value)::text END)
    FROM (SELECT value, json_build_object('r', value, 'v', CAST(:vpcs AS varchar[]),
                                          'h', CAST(:hosts AS varchar[]), 't', :topo, 'e', :moved,
                                          'q', CAST(:traces AS varchar[]))::text AS d
          FROM c) x""")


Q_REVISION = select(m.Counter.value).where(m.Counter.name == "revision")

# session.info key: the tenants a write transaction holds locked (absent outside writes)
LOCKED_TENANTS = "tianji_locked_tenants"
CREATED_TENANTS = "tianji_created_tenants"
# step 1 of the lock order (PostgreSQL): one statement, the tenants in id order
LOCK_TENANTS = text("SELECT id FROM tenants WHERE id = ANY(CAST(:tenants AS varchar[])) ORDER BY id "
                    "FOR NO KEY UPDATE")


@dataclass(frozen=True)
class TenantsOf:
    """Tenants found and locked by one statement of the caller's (selecting tenant ids, in id order, FOR NO KEY
    UPDATE), sent in one round trip with `then`: the body's first reads, which must come after the locks; their
    rows are in `WriteTxn.first`. For the hot paths, where a lookup of the tenants would be a round trip more."""

    stmt: Executable
    params: dict
    then: tuple[tuple[Executable, dict], ...] = ()


# What `write(tenants=...)` takes: the ids, a function of the transaction's session that finds them (a read
# before any lock: a row's tenant never changes, and a row gone meanwhile is the body's 404 to answer), or
# TenantsOf.
Tenants = Iterable[str | None] | Callable[[Session], Iterable[str | None]] | TenantsOf


class TenantNotLocked(RuntimeError):
    """A write changed a tenant's rows without taking that tenant's lock first: a bug in the handler, which
    must name the tenant to `Database.write(tenants=...)` (see LOCK ORDER)."""


def check_tenant_locked(s: Session, tenant_id: str | None) -> None:
    locked = s.info.get(LOCKED_TENANTS)
    if locked is not None and tenant_id is not None and tenant_id not in locked:
        raise TenantNotLocked(f"tenant {tenant_id}'s rows changed without its lock: pass it to "
                              f"Database.write(tenants=...); locked: {sorted(locked)}")


def _check_flush(s: Session, _ctx: UOWTransaction, _instances: object) -> None:
    """Every tenant-owned row inserted, changed or deleted in a write belongs to a tenant the write locked (or
    to a tenant it creates)."""
    locked = s.info.get(LOCKED_TENANTS)
    if locked is None:
        return
    # a tenant made in this write: nobody else can hold a lock on it
    created = s.info.get(CREATED_TENANTS, set()) | {o.id for o in s.new if isinstance(o, m.Tenant)}
    for obj in (*s.new, *s.dirty, *s.deleted):
        tid = getattr(obj, "tenant_id", None)
        if isinstance(tid, str) and tid not in locked and tid not in created:
            raise TenantNotLocked(f"{type(obj).__name__} of tenant {tid} changed without the tenant's lock: "
                                  f"pass it to Database.write(tenants=...); locked: {sorted(locked)}")


def _note_created_tenants(s: Session, _ctx: UOWTransaction) -> None:
    if LOCKED_TENANTS in s.info:
        s.info.setdefault(CREATED_TENANTS, set()).update(o.id for o in s.new if isinstance(o, m.Tenant))


class WriteTxn:
    def __init__(self, session: Session, revision: int) -> None:
        self.session = session
        self.changes = ChangeSet(revision)
        self.deferred: list[tuple[Executable, dict | list[dict]]] = []
        self.first: list[list] = []  # the rows of TenantsOf.then

    def defer(self, stmt: Executable, params: dict | list[dict]) -> None:
        """Run `stmt` (an INSERT) at the commit, before the stamp (with a list: once per row): for writes nothing
        reads back (inserts of rows whose keys we made). On PostgreSQL they go with the stamp and the COMMIT in one
        round trip; a constraint they break fails the transaction there, as it would have here. What the rows
        affect is stamped from the rows (`stamps.rows_affect`)."""
        rows_affect(stmt.table.name, params if isinstance(params, list) else [params], self.changes)
        self.deferred.append((stmt, params))

    def flush_deferred(self) -> None:
        """Run what was deferred now: a row about to be added refers to one of them (a foreign key)."""
        for stmt, params in self.deferred:
            self.session.execute(stmt, params, execution_options=STAMPED)
        self.deferred.clear()

    @property
    def revision(self) -> int:
        return self.changes.revision

    def _stamp(self) -> None:
        s, rev = self.session, self.revision
        # Core statements on the tables: no ORM session synchronisation needed for these stamps
        vpcs, hosts, counters = m.Vpc.__table__, m.Host.__table__, m.Counter.__table__
        if self.changes.vpcs:
            s.execute(update(vpcs).where(vpcs.c.id.in_(self.changes.vpcs)).values(revision=rev),
                      execution_options=STAMPED)
        if self.changes.hosts:
            s.execute(update(hosts).where(hosts.c.name.in_(self.changes.hosts)).values(config_revision=rev),
                      execution_options=STAMPED)
        if self.changes.topology:
            s.execute(update(counters).where(counters.c.name == "topology").values(value=rev))
        if self.changes.vteps_moved:
            self._stamp_vteps(s, rev)

    def _stamp_vteps(self, s: Session, rev: int) -> None:
        """The VTEP entries that appeared, changed or went, at this revision (as STAMP_NOTIFY does)."""
        hosts, counters, removed = m.Host.__table__, m.Counter.__table__, m.RemovedHost.__table__
        cs = self.changes
        if cs.vteps:
            s.execute(update(hosts).where(hosts.c.name.in_(cs.vteps)).values(vtep_revision=rev),
                      execution_options=STAMPED)
            s.execute(delete(removed).where(removed.c.name.in_(cs.vteps)))
        if cs.removed:
            s.execute(delete(removed).where(removed.c.name.in_(cs.removed)))
            s.execute(insert(removed), [{"name": n, "revision": rev} for n in sorted(cs.removed)])
        s.execute(update(counters).where(counters.c.name == "vteps").values(value=rev))


def make_engine(url: str, synchronous: str = "FULL") -> Engine:
    """`synchronous`: SQLite's; FULL by default, so an acknowledged write survives a power failure (WAL with
    NORMAL may lose the last commits; the operator may choose it with TIANJI_SQLITE_SYNCHRONOUS)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=8)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _rec) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA synchronous={synchronous}")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()
            # Python's sqlite3 opens a transaction only before a write, so each SELECT of a read saw the latest
            # commit: a config compiled across a write could carry the write's revision without its content,
            # and its watcher would never be told (seen here: a port missing from its host's config). Every
            # transaction is now a real one (SQLAlchemy's recipe for pysqlite): reads see one WAL snapshot.
            dbapi_conn.isolation_level = None

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn) -> None:
            # deferred: a write takes the write lock at its first statement, which is the revision bump
            conn.exec_driver_sql("BEGIN")

        return engine
    # no pool_pre_ping: it costs a round trip on every checkout; a connection that died is invalidated on its
    # first error, writes retry (with_retries) and watches recheck
    return create_engine(url, pool_size=16, max_overflow=16, pool_recycle=3600)


LEADER_LOCK = 0x7469616E6A6902  # PostgreSQL advisory lock key ("tianji" and a number); schema.py has 01


class Database:
    def __init__(self, url: str, synchronous: str = "FULL") -> None:
        self.url = url
        self.engine = make_engine(url, synchronous)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        event.listen(self.sessions, "before_flush", _check_flush)
        event.listen(self.sessions, "before_flush", stamps.collect)
        event.listen(self.sessions, "do_orm_execute", stamps.guard)
        event.listen(self.sessions, "after_flush", _note_created_tenants)
        event.listen(self.sessions, "after_flush", note_created_resource)
        self.listeners: list[Callable[[ChangeSet], None]] = []
        # SQLite has one writer: this process's writers queue here and the next one starts the moment the lock is
        # free, where SQLite's busy handler would have them sleep and retry in steps of up to 100 ms (measured: a
        # third of a bulk load's request threads asleep in it). PostgreSQL writers run in parallel.
        self._writer: AbstractContextManager = threading.Lock() if url.startswith("sqlite") else nullcontext()

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def migrate(self) -> None:
        schema.upgrade(self.engine)

    def migration_head(self) -> str:
        """The schema this code needs: the newest migration's revision."""
        return schema.head()

    def migration_current(self) -> str | None:
        with self.engine.connect() as c:
            return c.execute(text("SELECT version_num FROM alembic_version")).scalar()

    @contextmanager
    def read(self, single: bool = False) -> Iterator[Session]:
        """A read session. `single=True`: for reads that need no snapshot around them; on PostgreSQL they then run
        in autocommit, without the BEGIN and ROLLBACK round trips (a heartbeat is such a read, 50 times a second
        with 100 hosts)."""
        with self.sessions() as s:
            if single and self.is_postgres:
                s.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
            yield s

    @contextmanager
    def write(self, tenants: Tenants = (), concurrent: bool = False) -> Iterator[WriteTxn]:
        """One transaction: lock `tenants` (every tenant whose rows the body changes), bump the revision, run the
        body, stamp what it touched with the revision, commit, in the LOCK ORDER above. Any exception rolls
        everything back, so a failed request changes nothing.

        The revision is bumped right after the tenants' locks, which takes the write lock (the counter's row lock
        on PostgreSQL, the database lock on SQLite): writers queue instead of deadlocking on a later lock upgrade,
        and the revision order is the commit order. `concurrent=True` (PostgreSQL; the port create paths) bumps
        last instead, so the counter is locked only for the commit and writers of different tenants run in
        parallel: only for bodies that insert rows and never update VPC or host rows (another writer's stamps
        would wait on those while it waits for the counter). Unique constraints (plus a subnet row lock while
        allocating) keep allocations unique either way."""
        late = concurrent and self.is_postgres
        if (claim := CLAIM.get()) is not None and not claim.taken:
            claim.created = None  # a write re-run after a deadlock finds its row again
        else:
            claim = None
        with self._writer, self.sessions() as s, s.begin():
            txn = WriteTxn(s, 0)
            if isinstance(tenants, TenantsOf):
                from controller.state.sqlset import fetch_all

                locked, *txn.first = fetch_all(s, [(tenants.stmt, tenants.params), *tenants.then])
                ids = [row[0] for row in locked]
            else:
                ids = sorted({t for t in (tenants(s) if callable(tenants) else tenants) if t})
                if ids and self.is_postgres:
                    s.execute(LOCK_TENANTS, {"tenants": ids})
            s.info[LOCKED_TENANTS] = frozenset(ids)
            s.info[CHANGES] = txn.changes  # what the stamps hooks find the rows affect (stamps.py)
            if not late:
                txn.changes.revision = self._bump(s)
            yield txn
            s.flush()
            if claim is not None:
                take(s, txn.deferred, claim)
            log_entry = audit.entry()
            if self.is_postgres:
                txn.changes.revision = self._finish(s, txn, bump=late, log_entry=log_entry)
            else:
                for stmt, params in txn.deferred:
                    s.execute(stmt, params, execution_options=STAMPED)
                txn._stamp()
                change_log.record(s, txn.changes)
                if log_entry is not None:
                    s.execute(audit.INSERT_ENTRY, log_entry)
        if claim is not None:
            claim.taken = True  # committed with the key: a second write of the request takes nothing
        for cb in self.listeners:
            cb(txn.changes)

    def write_rows(self, stmt: Executable, rows: list[dict]) -> None:
        """One transaction of bookkeeping that is not a change of config (no revision, no audit entry): heartbeats.
        On SQLite it queues with the other writers (see `_writer`), never in SQLite's busy handler."""
        with self._writer, self.sessions() as s, s.begin():
            s.execute(stmt, rows)

    def _finish(self, s: Session, txn: WriteTxn, bump: bool, log_entry: dict | None = None) -> int:
        """PostgreSQL: the deferred writes, then stamp, notify and (with `bump`) take the next revision in one
        statement (STAMP_NOTIFY), then COMMIT: sent together, one round trip (psycopg's pipeline mode). A late
        writer holds the counter's row lock only while the server runs the stamp and the commit, never across a
        round trip to this process (where, under load, the answer waits for the GIL)."""
        from controller.state.sqlset import driver_form, pipeline

        cs, dialect = txn.changes, self.engine.dialect
        with pipeline(s) as conn:  # a lost constraint race is SQLAlchemy's IntegrityError
            for stmt, params in txn.deferred:
                forms = [driver_form(stmt, dialect, r) for r in (params if isinstance(params, list) else [params])]
                conn.cursor().executemany(forms[0][0], [values for _sql, values in forms])
            stamp = conn.cursor()
            stamp.execute(*driver_form(STAMP_NOTIFY, dialect, {
                "bump": int(bump), "vpcs": sorted(cs.vpcs), "hosts": sorted(cs.hosts), "topo": cs.topology,
                "vteps": sorted(cs.vteps), "removed": sorted(cs.removed), "moved": cs.vteps_moved,
                "traces": sorted(cs.traces), "limit": NOTIFY_LIMIT}))
            if log_entry is not None:  # after the stamp: it reads the revision the stamp took
                conn.cursor().execute(*driver_form(audit.INSERT_ENTRY, dialect, log_entry))
            conn.commit()  # the session's own commit then finds nothing to do
        return stamp.fetchone()[0]

    @staticmethod
    def _bump(s: Session) -> int:
        c = m.Counter.__table__
        return s.execute(
            update(c).where(c.c.name == "revision").values(value=c.c.value + 1).returning(c.c.value)
        ).scalar_one()

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A read transaction that sees one consistent snapshot (REPEATABLE READ on PostgreSQL; on SQLite every
        transaction reads one WAL snapshot, see make_engine)."""
        with self.sessions() as s:
            if self.is_postgres:
                # psycopg then opens the transaction with BEGIN ISOLATION LEVEL REPEATABLE READ: no round trip of
                # its own (SET TRANSACTION was one), and the pool resets the level client-side on return
                s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            yield s  # the session's implicit transaction ends (rolled back) when it closes

    def revision(self) -> int:
        with self.sessions() as s:
            return s.execute(Q_REVISION).scalar_one()

    def changes_after(self, revision: int) -> tuple[int, list[tuple[int, str]]]:
        """The revision now and the change log's entries after `revision` (SQLite), from one snapshot."""
        with self.snapshot() as s:
            now = s.execute(Q_REVISION).scalar_one()
            return now, change_log.after(s, revision) if now > revision else []
