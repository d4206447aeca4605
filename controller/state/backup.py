"""Backup and restore of the controller's state (`tianji controller backup FILE` / `restore FILE`).

A backup is one file: a gzipped tar of `manifest.json` (backend, revision, schema, counts) and the database as its
backend copies it consistently while the controller serves: SQLite's online backup API, PostgreSQL's `pg_dump` in
a snapshot exported from the transaction that read the manifest's revision (so the two agree).

A restore runs with every controller stopped. It keeps what it replaces (SQLite: the old file beside the new; both:
a backup of it first, in the state directory), loads the backup in one step (SQLite: a rename; PostgreSQL: one
transaction that drops the schema and loads the dump), migrates it to this code's schema, then opens a new epoch:
- the revision moves past both the backup's and the replaced database's, and every VPC, host and the topology
  are stamped with it, so every agent and gateway instance takes its config once, from the restored state, as a
  delta like any other (a revision never goes back: a watcher's `after` would then be ahead of every stamp and it
  would be told nothing changed);
- what the replaced database had handed out and the backup does not hold is treated as deleted at the restore:
  its VNIs and EIPs rest in the quarantine a delete puts them in (controller/state/freed_models.py), its hosts'
  VTEP entries go as removals. Port addresses are handed out again as after a delete (the port they belonged to
  is unknown again, so its VIF gets no flows).
When the replaced database is gone (a disaster), pass `revision_floor` above any revision agents may hold; without
it the controller still answers a watcher whose `after` is ahead of its revision with a whole config
(controller/southbound/host_deltas.py, controller/api/gateways.py).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Engine

from controller.state import epoch, schema
from controller.state.epoch import Live

FORMAT = "tianji-backup/1"
COUNTED = ("tenants", "vpcs", "subnets", "ports", "hosts", "eips")
Progress = Callable[[str], None]


class BackupError(RuntimeError):
    """What went wrong, and what to do: nothing was changed."""


@dataclass
class Manifest:
    backend: str  # "sqlite" or "postgresql"
    revision: int
    schema: str | None  # the Alembic revision of the backed-up database
    created_at: str
    counts: dict[str, int] = field(default_factory=dict)
    format: str = FORMAT

    def json(self) -> bytes:
        return json.dumps(self.__dict__, indent=1, sort_keys=True).encode()


@dataclass
class Restored:
    manifest: Manifest
    revision: int  # the restore's epoch: every stamp is at it
    kept: Path | None  # what it replaced
    quarantined_vnis: list[int]
    quarantined_eips: list[str]
    removed_hosts: list[str]


# --- where the database is -----------------------------------------------------------------------------------

def backend_of(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def sqlite_path(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


def libpq_url(url: str) -> str:
    """SQLAlchemy's `postgresql+psycopg://` as the PostgreSQL tools take it."""
    return "postgresql://" + url.split("://", 1)[1]


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BackupError(f"{name} is not installed: install PostgreSQL's client tools (apt-get install "
                          "postgresql-client), of the server's major version or newer")
    return found


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, **kw)
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip() if isinstance(r.stderr, bytes) else str(r.stderr).strip()
        raise BackupError(f"{Path(cmd[0]).name} failed (exit {r.returncode}): {err[-2000:]}")
    return r


# --- reading a database's facts ------------------------------------------------------------------------------

def _facts(conn: Any) -> tuple[int, str | None, dict[str, int]]:
    """(revision, schema, counts) of a database through a DB-API connection in the snapshot to describe."""
    cur = conn.cursor()
    cur.execute("SELECT value FROM counters WHERE name = 'revision'")
    rev = int(cur.fetchone()[0])
    cur.execute("SELECT version_num FROM alembic_version")
    row = cur.fetchone()
    counts = {}
    for t in COUNTED:
        cur.execute(f"SELECT count(*) FROM {t}")
        counts[t] = int(cur.fetchone()[0])
    return rev, row[0] if row else None, counts


def read_live(engine: Engine) -> Live | None:
    """What a database that is about to be replaced holds; None when it has no Tianji schema (a new one)."""
    if not inspect(engine).has_table("counters"):
        return None
    with engine.connect() as c:
        live = Live(revision=int(c.execute(text("SELECT value FROM counters WHERE name = 'revision'")).scalar() or 0))
        live.vnis = set(c.execute(text("SELECT vni FROM vpcs")).scalars())
        live.eips = set(c.execute(text("SELECT address FROM eips")).scalars())
        live.hosts = set(c.execute(text("SELECT name FROM hosts")).scalars())
    return live


# --- backup --------------------------------------------------------------------------------------------------

def backup(url: str, out: Path, progress: Progress = lambda _: None) -> Manifest:
    """Copy the database at `url` into the backup file `out` while the controller serves."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tianji-backup-", dir=out.parent) as tmp:
        if backend_of(url) == "sqlite":
            manifest, payload = _backup_sqlite(sqlite_path(url), Path(tmp), progress)
        else:
            manifest, payload = _backup_postgres(url, Path(tmp), progress)
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w:gz") as tar:
            info = tarfile.TarInfo("manifest.json")
            data = manifest.json()
            info.size, info.mtime = len(data), int(time.time())
            tar.addfile(info, io.BytesIO(data))
            tar.add(payload, arcname=payload.name)
        os.replace(partial, out)  # a backup file is whole or absent
    return manifest


def _backup_sqlite(db: Path, tmp: Path, progress: Progress) -> tuple[Manifest, Path]:
    if not db.exists():
        raise BackupError(f"no database at {db}: give the controller's --state-dir (or TIANJI_STATE_DIR)")
    copy = tmp / "state.sqlite"
    progress(f"copying {db} (SQLite online backup)")
    src, dst = sqlite3.connect(db, timeout=30), sqlite3.connect(copy)
    try:
        src.backup(dst)  # one step: one consistent snapshot, writers wait only for its pages
        rev, ver, counts = _facts(dst)
    finally:
        src.close()
        dst.close()
    return Manifest("sqlite", rev, ver, _now(), counts), copy


def _backup_postgres(url: str, tmp: Path, progress: Progress) -> tuple[Manifest, Path]:
    import psycopg

    pg_dump = _tool("pg_dump")
    dump = tmp / "state.pgdump"
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        snapshot = conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
        rev, ver, counts = _facts(conn)
        progress(f"dumping revision {rev} (pg_dump, in the snapshot that read it)")
        _run([pg_dump, "--format=custom", "--no-owner", "--no-privileges", f"--snapshot={snapshot}",
              "--file", str(dump), "--dbname", libpq_url(url)])
        conn.rollback()
    return Manifest("postgresql", rev, ver, _now(), counts), dump


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --- restore -------------------------------------------------------------------------------------------------

def read_backup(path: Path, into: Path) -> tuple[Manifest, Path]:
    """The manifest and the database file of a backup, unpacked into `into`."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            names = tar.getnames()
            if "manifest.json" not in names:
                raise BackupError(f"{path} is not a Tianji backup (no manifest.json)")
            mf = tar.extractfile("manifest.json")
            assert mf is not None
            raw = json.loads(mf.read())
            if raw.get("format") != FORMAT:
                raise BackupError(f"{path}: unknown backup format {raw.get('format')!r} (this release reads {FORMAT})")
            manifest = Manifest(**raw)
            payload = "state.sqlite" if manifest.backend == "sqlite" else "state.pgdump"
            if payload not in names:
                raise BackupError(f"{path} lacks {payload}: the backup is incomplete")
            member = tar.extractfile(payload)  # read as bytes: never a path the archive chose
            if member is None:
                raise BackupError(f"{path}: {payload} is not a file")
            with open(into / payload, "wb") as f:
                shutil.copyfileobj(member, f)
    except (tarfile.TarError, OSError, EOFError, json.JSONDecodeError, TypeError) as e:
        raise BackupError(f"{path} is not a readable Tianji backup: {e}") from None
    return manifest, into / payload


def check_compatible(manifest: Manifest, url: str) -> None:
    if manifest.backend != backend_of(url):
        raise BackupError(f"the backup is of a {manifest.backend} database and this controller's is "
                          f"{backend_of(url)}: restore it onto the same backend")
    known = schema.revisions()
    if manifest.schema is not None and manifest.schema not in known:
        raise BackupError(f"the backup's schema {manifest.schema} is newer than this release knows (its newest: "
                          f"{schema.head()}): restore it with the release that made it, or a newer one")


def restore(url: str, path: Path, state_dir: Path, revision_floor: int = 0,
            progress: Progress = lambda _: None) -> Restored:
    """Replace the database at `url` by the backup `path` (every controller stopped: see module doc)."""
    with tempfile.TemporaryDirectory(prefix="tianji-restore-", dir=state_dir if state_dir.exists() else None) as t:
        manifest, payload = read_backup(Path(path), Path(t))
        check_compatible(manifest, url)
        check_stopped(url)
        engine = create_engine(url)
        try:
            live = read_live(engine)
        finally:
            engine.dispose()
        kept = None
        if live is not None:
            kept = state_dir / f"before-restore-{time.strftime('%Y%m%dT%H%M%S')}-r{live.revision}.tjbackup"
            progress(f"keeping the state it replaces (revision {live.revision}) in {kept}")
            backup(url, kept)
        progress(f"loading the backup's revision {manifest.revision} ({manifest.created_at})")
        if manifest.backend == "sqlite":
            _load_sqlite(payload, sqlite_path(url))
        else:
            _load_postgres(payload, url)
    engine = create_engine(url)
    try:
        progress("migrating it to this release's schema")
        schema.upgrade(engine)
        opened = epoch.open_epoch(engine, manifest.revision, live, revision_floor,
                                  f"{Path(path).name}: revision {manifest.revision} of {manifest.created_at}")
    finally:
        engine.dispose()
    progress(f"restored: revision {opened.revision}; every agent and gateway takes its config from it once")
    return Restored(manifest, opened.revision, kept, opened.vnis, opened.eips, opened.hosts)


def check_stopped(url: str) -> None:
    """A restore under a serving controller would pull its state from under it: refused, saying what serves."""
    if backend_of(url) == "sqlite":
        db = sqlite_path(url)
        if users := _sqlite_users(db):
            raise BackupError(f"process(es) {', '.join(map(str, users))} have {db} open: stop the controller "
                              "(and whatever else reads it), restore, then start it again")
        return
    import psycopg

    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        others = conn.execute("SELECT pid, application_name, client_addr FROM pg_stat_activity WHERE datname = "
                              "current_database() AND pid <> pg_backend_pid()").fetchall()
    if others:
        who = ", ".join(f"pid {pid}" + (f" ({app})" if app else "") + (f" from {addr}" if addr else "")
                        for pid, app, addr in others[:5])
        raise BackupError(f"{len(others)} other session(s) use this database ({who}): stop every controller "
                          "replica (and whatever else is connected), then restore")


def _sqlite_users(db: Path) -> list[int]:
    """Other processes holding locks on the database: SQLite's (a WAL reader locks its -shm while open) and a
    serving controller's on `<db>.lock` (controller/replicas.py hold_sqlite), all listed in /proc/locks."""
    inodes = set()
    for f in (db, Path(str(db) + "-shm"), Path(str(db) + ".lock")):
        try:
            inodes.add(os.stat(f).st_ino)
        except FileNotFoundError:
            pass
    users = set()
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if "->" in parts or len(parts) < 6:  # a waiter's line
            continue
        pid, ino = int(parts[4]), int(parts[5].rsplit(":", 1)[-1])
        if ino in inodes and pid != os.getpid():
            users.add(pid)
    return sorted(users)


def _load_sqlite(copy: Path, db: Path) -> None:
    """The backup's file takes the database's place in one rename; the old WAL and its index go (they belong to
    the replaced file, and SQLite would replay them into the new one)."""
    db.parent.mkdir(parents=True, exist_ok=True)
    staged = db.with_name(db.name + ".restoring")
    shutil.copyfile(copy, staged)
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    os.replace(staged, db)


def _load_postgres(dump: Path, url: str) -> None:
    """One transaction: drop the schema, create it again, load the dump; an error leaves the database as it was."""
    sql = _run([_tool("pg_restore"), "--no-owner", "--no-privileges", "--file", "-", str(dump)]).stdout
    script = b"DROP SCHEMA public CASCADE;\nCREATE SCHEMA public;\n" + sql
    _run([_tool("psql"), "--quiet", "--no-psqlrc", "-v", "ON_ERROR_STOP=1", "--single-transaction",
          "--dbname", libpq_url(url)], input=script)
