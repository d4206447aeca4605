"""SQLite's change log: a worker hears what another worker's write touched, as NOTIFY tells it on PostgreSQL, and
wakes only the streams it concerns; a revision the log lacks wakes everyone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from controller.southbound.watch import Broadcaster, Wake
from controller.state import change_log
from controller.state.db import Database


def next_wake(loop: asyncio.AbstractEventLoop, q: asyncio.Queue) -> Wake:
    return loop.run_until_complete(asyncio.wait_for(q.get(), 5))


def test_another_process_write_wakes_with_what_it_touched(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    here, there = Database(url), Database(url)  # two worker processes on one file
    here.migrate()
    loop = asyncio.new_event_loop()
    bc = Broadcaster(here)
    bc.start(loop)
    every = bc.subscribe()
    try:
        with there.write() as txn:
            txn.changes.add(vpcs=["vpc-a"], hosts=["hv1"])
        w = next_wake(loop, every.queue)
        assert (w.vpcs, w.hosts, w.unknown, w.ordered) == ({"vpc-a"}, {"hv1"}, False, True)
        assert bc.confirmed == w.revision
        # a stream holding another VPC is not woken by it
        held = bc.subscribe("hv2")
        bc.keys(held, frozenset({"vpc-b"}))
        with there.write() as txn:
            txn.changes.add(vpcs=["vpc-a"])
        assert next_wake(loop, every.queue).vpcs == {"vpc-a"} and held.queue.empty()
        # a revision taken outside the log (an older version's write): every watch rechecks
        with there.engine.begin() as c:
            c.execute(text("UPDATE counters SET value = value + 1 WHERE name = 'revision'"))
        w = next_wake(loop, every.queue)
        assert w.unknown and not held.queue.empty()
    finally:
        bc.stop()
        loop.close()


def test_the_log_keeps_its_last_revisions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(change_log, "KEEP", 3)
    db = Database(f"sqlite:///{tmp_path / 't.db'}")
    db.migrate()
    for _ in range(6):
        with db.write() as txn:
            txn.changes.add(hosts=["hv1"])
    now, entries = db.changes_after(0)
    assert [r for r, _ in entries] == [now - 2, now - 1, now]
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(change_log.ChangeLogEntry)).scalar() == 3
