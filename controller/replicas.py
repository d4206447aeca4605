"""Several controller replicas on one PostgreSQL database: what they share, and what runs once per cluster.

- The admin credential's hash lives in the database (`cluster_settings`), not in a replica's state directory: the
  replica that finds none creates the token (written to its state directory, or read from the file the operator
  names, TIANJI_ADMIN_TOKEN_FILE) and every replica accepts it.
- One replica (one process of one replica, with --workers) leads: it holds a PostgreSQL advisory lock on a session
  of its own, which the server releases when that session dies, so a killed leader hands over within one election
  tick. Only the leader runs what acts on a timer for the whole cluster (the liveness check that marks silent hosts
  down and so moves EIPs and buckets), so no two replicas fail the same instance over. A new leader first waits
  `TAKEOVER_GRACE_S`: the hosts that were beating to a dead replica are moving to a live one meanwhile.
- SQLite stays single-replica: `hold_sqlite` refuses a second controller on the same file; its leader lock is a
  file lock among the workers of the one controller.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import IO

from controller.auth import new_token, token_hash
from controller.settings import Settings
from controller.state import models as m
from controller.state.db import LEADER_LOCK, Database

log = logging.getLogger("tianji.controller")

ELECTION_TICK_S = 0.5  # how often a follower asks for the lock (and the leader checks it still has it)
TAKEOVER_GRACE_S = 3.0  # a new leader judges no host on silence until this long after it took over
# a leader stalled this long (SIGSTOP, a frozen VM) loses its session, and the lock with it: PostgreSQL ends
# sessions idle for longer (a running leader's is busy every tick)
STALLED_LEADER_S = 5
ADMIN_HASH = "admin_token_sha256"
SHARED = "settings"
# what must be the same on every replica: they compile the same configs, allocate from the same ranges and judge the
# same silences (the rest, such as rate limits or TLS files, is each process's own)
SHARED_SETTINGS = ("vni_range", "vni_quarantine_s", "eip_quarantine_s", "host_down_after", "gateway_down_after",
                   "private_line_asn", "private_line_reserved_vlans", "underlay_mtu", "eip_pool", "service_network",
                   "service_source_pool", "underlay_cidrs", "vpc_public_cidrs", "quotas")


def hold_sqlite(settings: Settings) -> IO | None:
    """On SQLite, an exclusive lock on `<db>.lock` held until this process exits (its workers are its children and
    share the file): a second controller on the same file stops with a message instead of corrupting the
    single-writer assumptions. None on PostgreSQL, where replicas are welcome."""
    if settings.database_url and not settings.database_url.startswith("sqlite"):
        return None
    path = Path(settings.url.removeprefix("sqlite:///") + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")  # held open for the process's life
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        raise SystemExit(f"tianji: another controller (pid {f.read().strip() or '?'}) serves {settings.url}: SQLite "
                         "takes one controller; stop it, or run replicas on PostgreSQL (TIANJI_DATABASE_URL)") from None
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    return f


def admin_credential(db: Database, state_dir: Path, token_file: Path | None) -> tuple[str | None, str, bool]:
    """(the admin token if this replica knows it, its hash, whether it was created now). The database's hash wins:
    a replica whose state directory holds another token (made before replicas shared one) says so and is ignored;
    an operator's `token_file` is the credential, and replaces what the database held."""
    own = state_dir / "admin.token"
    known = token_file if token_file is not None else own
    token = known.read_text().strip() if known.exists() else None
    with db.read() as s:
        stored = s.get(m.ClusterSetting, ADMIN_HASH)
        stored_hash = stored.value if stored else None
    if token_file is not None:
        if token is None:
            raise SystemExit(f"tianji: the admin token file {token_file} does not exist")
        if stored_hash != token_hash(token):
            _store(db, token_hash(token), replace=True)
        return token, token_hash(token), False
    if stored_hash is not None:
        if token is not None and token_hash(token) != stored_hash:
            log.warning("%s is not the cluster's admin token (another replica made the one in the database): "
                        "ignored; use the token of the replica that made it, or TIANJI_ADMIN_TOKEN_FILE", own)
            return None, stored_hash, False
        return token, stored_hash, False
    token = token or new_token("tja")
    if not _store(db, token_hash(token), replace=False):  # another replica made one meanwhile: theirs
        return admin_credential(db, state_dir, None)
    if not own.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(own, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token, token_hash(token), True
    return token, token_hash(token), False


def shared_settings(db: Database, settings: Settings) -> list[str]:
    """Records this replica's cluster-wide settings in the database, and names those that differ from what the
    replicas before it recorded (a warning at start, and in the admin's /healthz: they must be given the same)."""
    mine = {k: getattr(settings, k) for k in SHARED_SETTINGS}
    with db.read() as s:
        row = s.get(m.ClusterSetting, SHARED)
        theirs = json.loads(row.value) if row else None
    differ = sorted(k for k in mine if theirs is not None and json.dumps(theirs.get(k), sort_keys=True)
                    != json.dumps(mine[k], sort_keys=True, default=str))
    if differ:
        log.warning("this replica's %s differ from what the other replicas were started with: give every replica "
                    "the same (TIANJI_%s); this replica's are now recorded", ", ".join(differ),
                    ", TIANJI_".join(k.upper() for k in differ))
    _store(db, json.dumps(mine, sort_keys=True, default=str), replace=True, name=SHARED)
    return differ


def _store(db: Database, value: str, replace: bool, name: str = ADMIN_HASH) -> bool:
    from sqlalchemy.exc import IntegrityError

    try:
        with db.sessions() as s, s.begin():
            row = s.get(m.ClusterSetting, name)
            if row is None:
                s.add(m.ClusterSetting(name=name, value=value))
            elif replace:
                row.value = value
            else:
                return False
        return True
    except IntegrityError:
        return False


class Leadership:
    """Whether this process leads the cluster's timers. `leading()` is cheap (a flag); a thread keeps it true."""

    def __init__(self, db: Database, state_dir: Path) -> None:
        self.db, self.state_dir = db, state_dir
        self.is_leader = False
        self.since = 0.0  # monotonic time it took the lead
        self.checked = 0.0  # monotonic time of the election loop's last answer (readiness: it follows or leads)
        self.handovers = 0
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="leader-election", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def leading(self, grace: float = TAKEOVER_GRACE_S) -> bool:
        """Leads, has for `grace` seconds (what it decides on silence began after it took over), and the election
        confirmed it within two ticks (after a stall, not before it is confirmed again: the lock may be gone)."""
        t = time.monotonic()
        return self.is_leader and t - self.since >= grace and t - self.checked < 2 * ELECTION_TICK_S

    @property
    def role(self) -> str:
        return "leader" if self.is_leader else "follower"

    def live(self, within: float = 5 * ELECTION_TICK_S) -> bool:
        return time.monotonic() - self.checked < within

    def _take(self) -> None:
        if not self.is_leader:
            self.is_leader, self.since, self.handovers = True, time.monotonic(), self.handovers + 1
            log.info("this controller (pid %d) now leads: it runs the cluster's liveness checks", os.getpid())

    def _lose(self, why: str) -> None:
        if self.is_leader:
            log.warning("this controller (pid %d) no longer leads: %s", os.getpid(), why)
        self.is_leader = False

    def _run(self) -> None:
        if self.db.is_postgres:
            self._run_pg()
        else:
            self._run_file()

    def _run_file(self) -> None:
        with open(self.state_dir / "leader.lock", "a+") as f:  # closed at stop: the lock goes with it
            while not self._stop.is_set():
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._take()
                except BlockingIOError:
                    pass
                self.checked = time.monotonic()
                self._stop.wait(ELECTION_TICK_S)
        self._lose("stopped")

    def _run_pg(self) -> None:
        import psycopg

        url = self.db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while not self._stop.is_set():
            try:
                with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
                    try:
                        conn.execute(f"SET idle_session_timeout = '{STALLED_LEADER_S}s'")
                    except psycopg.Error:  # before PostgreSQL 14: a stalled leader keeps the lock while stalled
                        pass
                    while not self._stop.is_set():
                        if self.is_leader:
                            conn.execute("SELECT 1")  # the session (and so the lock) still holds
                        elif conn.execute(f"SELECT pg_try_advisory_lock({LEADER_LOCK})").fetchone()[0]:
                            self._take()
                        self.checked = time.monotonic()
                        self._stop.wait(ELECTION_TICK_S)
            except Exception as e:  # the session is gone, and the lock with it
                self._lose(f"its database session ended ({e})")
                self._stop.wait(ELECTION_TICK_S)
        self._lose("stopped")
