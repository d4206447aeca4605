"""Host liveness: heartbeats are noted in memory and written together, once per liveness tick; hosts silent for too
long are marked down.

A hundred agents beating every 2 s were a hundred small transactions every few seconds (each an fsync on SQLite),
contending with tenants' writes for the one writer. One transaction per tick carries them all; a beat reaches the
database at most a tick (a quarter of the shortest silence allowed) after it arrived, and the down check of this
process writes what it holds first, so it never judges a host on a beat it has not written."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, select, text, update

from controller.roles.line.placement import instance_changed
from controller.state import models as m
from controller.state.db import Database
from controller.state.models import now

if TYPE_CHECKING:
    from controller.settings import Settings

_HOSTS = m.Host.__table__
_WRITE_SEEN = (update(_HOSTS).where(_HOSTS.c.name == bindparam("b_name"), _HOSTS.c.last_seen < bindparam("b_seen"))
               .values(last_seen=bindparam("b_seen")))
# PostgreSQL: one statement, and rows a writer holds are skipped (kept for the next tick), never waited for: a
# tenant's write stamping its hosts (db.STAMP_NOTIFY) and a mark-down lock host rows too, and a beat must neither
# queue behind them nor deadlock with them. Answers the rows it skipped.
_WRITE_SEEN_PG = text("""
    WITH v AS (SELECT * FROM unnest(CAST(:names AS varchar[]), CAST(:seens AS timestamptz[])) AS v(name, seen)),
         free AS (SELECT name FROM hosts WHERE name = ANY(CAST(:names AS varchar[])) ORDER BY name
                  FOR NO KEY UPDATE SKIP LOCKED),
         w AS (UPDATE hosts SET last_seen = v.seen FROM v
               WHERE hosts.name = v.name AND hosts.name IN (SELECT name FROM free) AND hosts.last_seen < v.seen)
    SELECT name FROM hosts WHERE name = ANY(CAST(:names AS varchar[])) EXCEPT SELECT name FROM free""")


def beat_pace(settings: Settings, kind: str) -> float:
    """How often a host of `kind` need beat (every report's answer says it): a fifth of the silence that marks it
    down, so that no single late beat is a silence. A gateway beating ten times a second where its silence is
    2 s cost the controller a report every 100 ms per instance for nothing."""
    return (settings.gateway_down_after if kind == "gateway" else settings.host_down_after) / 5


def beat_every(silence: float) -> float:
    """How often a host's beat needs writing (and a stream's noting): a quarter of the silence allowed."""
    return silence / 4


class Beats:
    """The latest heartbeat of each host that beat since its last was written (this process's share of them).

    A beat may say how often it needs writing (`every`): an open config stream notes one at every liveness tick
    (controller/southbound/open_streams.py), and the database needs one per host every quarter of the silence
    allowed, not each of them; the others stay noted here, where this process's own liveness check sees them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[datetime, float]] = {}  # host -> (when, how often it needs writing)
        self._written: dict[str, datetime] = {}

    def note(self, host: str, every: float = 0.0, at: datetime | None = None) -> None:
        """A beat of `host`, heard `at` (now by default); never older than one already noted."""
        at = at or now()
        with self._lock:
            if (held := self._pending.get(host)) is None or held[0] <= at:
                self._pending[host] = (at, every)

    def pending(self) -> int:
        return len(self._pending)

    def since_flush(self) -> dict[str, datetime]:
        """The beats noted and not written yet (a copy)."""
        with self._lock:
            return {h: t for h, (t, _) in self._pending.items()}

    def flush(self, db: Database) -> int:
        """Writes every pending beat that is due in one transaction (never moving a `last_seen` back); how many.
        A beat nothing newer followed for `every` is due too: its host may have gone silent, and the leader (maybe
        another process) must judge it from its last beat, not from the one written before it."""
        at = now()
        with self._lock:
            due = {h: t for h, (t, every) in self._pending.items() if every <= 0 or h not in self._written
                   or (t - self._written[h]).total_seconds() >= every or (at - t).total_seconds() >= every}
            for h in due:
                del self._pending[h]
        if not due:
            return 0
        names = sorted(due)
        skipped = set(names)  # until written
        try:
            if db.is_postgres:
                with db.sessions() as s, s.begin():
                    skipped = set(s.execute(_WRITE_SEEN_PG, {"names": names, "seens": [due[h] for h in names]})
                                  .scalars())
            else:  # one writer at a time: in name order, two processes' flushes lock alike
                db.write_rows(_WRITE_SEEN, [{"b_name": h, "b_seen": due[h]} for h in names])
                skipped = set()
        finally:
            with self._lock:  # kept for the next tick, unless a newer beat came meanwhile
                for h in skipped:
                    self._pending.setdefault(h, (due[h], 0.0))
        with self._lock:
            self._written.update({h: due[h] for h in names if h not in skipped})
        return len(names) - len(skipped)


def mark_silent_hosts_down(db: Database, silence: float, gateway_silence: float | None = None,
                           beats: Beats | None = None, hypervisors: bool = True) -> list[str]:
    """Hosts silent for longer than `silence` seconds (gateways: `gateway_silence`) go down, and their ports
    DOWN; a gateway going down stamps the VPCs gateways serve, so their targets and EIP homes follow (a
    hypervisor going down changes nothing anyone compiles: controller/state/stamps.py). `hypervisors` False: gateways
    only (a new leader's first `silence`: its hosts' streams are still finding it)."""
    if beats is not None:
        beats.flush(db)
    cutoffs = {"hypervisor": now() - timedelta(seconds=silence),
               "gateway": now() - timedelta(seconds=gateway_silence or silence)}
    silent = (m.Host.kind == "gateway") & (m.Host.last_seen < cutoffs["gateway"])
    if hypervisors:
        silent = silent | (m.Host.kind != "gateway") & (m.Host.last_seen < cutoffs["hypervisor"])
    with db.read() as s:  # the silent ones only: a thousand live hosts are not read every tick
        stale = [(n, k) for n, k in s.execute(select(m.Host.name, m.Host.kind).where(m.Host.status == "up", silent))]
    if stale and beats is not None:  # beats that came while the flush was writing: not in the database yet
        recent = beats.since_flush()
        stale = [(n, k) for n, k in stale if n not in recent or recent[n] < cutoffs.get(k, cutoffs["hypervisor"])]
    if not stale:
        return []
    with db.write() as t:
        for name, kind in sorted(stale):  # in name order, as the beats lock host rows
            h = t.session.get(m.Host, name)  # through the ORM: stamps.py says what its status changes
            if h is None or _aware(h.last_seen) >= cutoffs.get(kind, cutoffs["hypervisor"]):
                continue  # it beat meanwhile
            h.status = "down"
            t.session.execute(update(m.Port.__table__).where(m.Port.__table__.c.host == name, m.Port.status != "DOWN")
                              .values(status="DOWN", status_changed_at=now()))
            instance_changed(t.session, name, h)  # a private-line instance's sessions move to the live ones
    return [n for n, _ in stale]


def held_down(db: Database, hosts: set[str]) -> set[str]:
    """Those of `hosts` (hypervisors streaming to this process) the database holds down: a stream is a beat, but
    only a host's report brings it and its ports back up (this process asks for it: open_streams.py)."""
    if not hosts:
        return set()
    with db.read(single=True) as s:
        return set(s.execute(select(m.Host.name).where(m.Host.status == "down", m.Host.name.in_(sorted(hosts))))
                   .scalars())


def _aware(t: datetime) -> datetime:  # SQLite hands back naive datetimes (stored as UTC)
    return t if t.tzinfo else t.replace(tzinfo=UTC)
