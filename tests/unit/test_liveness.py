"""Heartbeats: noted in memory, all of a tick's written in one transaction, never moving a host's `last_seen` back;
the down check writes what it holds before it judges."""

from __future__ import annotations

from datetime import UTC, timedelta

from sqlalchemy import event, insert, select

from controller.southbound.liveness import Beats, mark_silent_hosts_down
from controller.state import models as m
from controller.state.db import Database

HOSTS = m.Host.__table__


def hosts(db: Database, n: int, seen_ago: float) -> list[str]:
    names = [f"hv{i}" for i in range(n)]
    seen = m.now() - timedelta(seconds=seen_ago)
    with db.sessions() as s, s.begin():
        s.execute(insert(HOSTS), [{"name": h, "vtep_ip": f"172.16.0.{i + 1}", "kind": "hypervisor", "status": "up",
                                   "last_seen": seen, "registered_at": seen, "config_revision": 0}
                                  for i, h in enumerate(names)])
    return names


def last_seen(db: Database) -> dict:
    with db.read() as s:
        return {h: (t if t.tzinfo else t.replace(tzinfo=UTC)) for h, t in s.execute(select(HOSTS.c.name,
                                                                                         HOSTS.c.last_seen))}


def test_a_tick_of_beats_is_one_transaction(database: Database) -> None:
    names = hosts(database, 60, seen_ago=30)
    beats = Beats()
    for h in names[:50]:
        beats.note(h)
    commits = []

    def count(conn) -> None:
        commits.append(1)

    event.listen(database.engine, "commit", count)
    try:
        assert beats.flush(database) == 50
    finally:
        event.remove(database.engine, "commit", count)
    assert len(commits) == 1
    seen = last_seen(database)
    fresh = m.now() - timedelta(seconds=5)
    assert all(seen[h] > fresh for h in names[:50]) and all(seen[h] < fresh for h in names[50:])
    assert beats.flush(database) == 0 and beats.pending() == 0


def test_the_down_check_writes_pending_beats_first(database: Database) -> None:
    names = hosts(database, 4, seen_ago=30)
    beats = Beats()
    beats.note("hv0")
    beats.note("hv1")
    down = mark_silent_hosts_down(database, silence=10, beats=beats)
    assert sorted(down) == ["hv2", "hv3"]
    with database.read() as s:
        status = dict(s.execute(select(HOSTS.c.name, HOSTS.c.status)).all())
    assert status == dict(zip(names, ("up", "up", "down", "down"), strict=True))


def test_a_late_beat_never_moves_last_seen_back(database: Database) -> None:
    hosts(database, 1, seen_ago=30)
    beats = Beats()
    beats.note("hv0")  # then a status write stamps a newer time before the flush
    newer = m.now() + timedelta(seconds=60)
    with database.sessions() as s, s.begin():
        s.execute(HOSTS.update().values(last_seen=newer))
    beats.flush(database)
    assert abs((last_seen(database)["hv0"] - newer).total_seconds()) < 1e-3


def test_a_beat_noted_while_the_check_runs_keeps_the_host_up(database: Database) -> None:
    """The check reads the database after its flush; a beat that arrives in between is only in memory, and must
    count (seen here: a NAT instance under load marked down while beating every 0.1 s, its EIPs moved away)."""
    hosts(database, 2, seen_ago=30)
    beats = Beats()

    class Late(Beats):
        def flush(self, db: Database) -> int:
            n = beats.flush(db)
            beats.note("hv0")  # arrives during the flush, after its batch was taken
            return n

        def since_flush(self):
            return beats.since_flush()

    assert mark_silent_hosts_down(database, silence=10, beats=Late()) == ["hv1"]


def test_a_streams_beats_are_written_once_per_interval_and_still_seen_here(database: Database) -> None:
    """An open config stream notes a beat at every keep-alive line; the database gets one per host per `every`
    seconds, and the ones held back still count for this process's own down check."""
    names = hosts(database, 3, seen_ago=30)
    beats = Beats()
    for h in names:
        beats.note(h, every=60)
    assert beats.flush(database) == 3  # never written before: due
    with database.sessions() as s, s.begin():  # as if those were written 30 s ago
        s.execute(HOSTS.update().values(last_seen=m.now() - timedelta(seconds=30)))
    written = last_seen(database)
    for h in names:
        beats.note(h, every=60)
    assert beats.flush(database) == 0 and last_seen(database) == written  # within the interval: held
    assert set(beats.since_flush()) == set(names)
    assert mark_silent_hosts_down(database, 5, beats=beats) == []  # the held beats count here
    assert sorted(mark_silent_hosts_down(database, 5)) == names  # and without them the hosts were silent
    beats.note(names[0])  # a beat without an interval (a status report) is written at once
    assert beats.flush(database) == 1


def test_a_beat_never_waits_for_a_host_row_a_writer_holds(pg_database: Database) -> None:
    """PostgreSQL: a host row locked by a tenant's write (its stamp) is skipped, its beat kept for the next tick,
    and the others written: beats neither queue behind writers nor deadlock with them."""
    names = hosts(pg_database, 4, seen_ago=30)
    beats = Beats()
    for h in names:
        beats.note(h)
    with pg_database.sessions() as writer, writer.begin():
        writer.execute(select(HOSTS.c.name).where(HOSTS.c.name == "hv1").with_for_update())
        assert beats.flush(pg_database) == 3
        assert beats.pending() == 1
    fresh = m.now() - timedelta(seconds=5)
    assert [h for h, t in last_seen(pg_database).items() if t < fresh] == ["hv1"]
    assert beats.flush(pg_database) == 1 and beats.pending() == 0
    assert all(t > fresh for t in last_seen(pg_database).values())



def test_a_hosts_last_beat_is_written_once_nothing_newer_came_for_an_interval(database: Database) -> None:
    """A stream's beat within the interval is held back; if it stays the host's last (the host went silent), it is
    written once it is an interval old, so that a leader in another process judges the host from it (it marked
    a host down 13 s after its last beat, with 15 s allowed, judging from the beat written before)."""
    import time

    (h,) = hosts(database, 1, seen_ago=30)
    beats = Beats()
    beats.note(h, every=0.5, at=m.now() - timedelta(seconds=0.2))
    assert beats.flush(database) == 1  # never written before
    last = m.now()
    beats.note(h, every=0.5, at=last)
    assert beats.flush(database) == 0  # fresh, and within the interval of the one written: held
    time.sleep(0.6)  # nothing newer came
    assert beats.flush(database) == 1
    assert abs((last_seen(database)[h] - last).total_seconds()) < 1e-3
