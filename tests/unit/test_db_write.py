"""Database.write: deferred inserts run at the commit, with the stamp (on PostgreSQL in the same round trip as the
COMMIT); a constraint they break fails the whole write as SQLAlchemy's IntegrityError (what with_retries retries
on), and changes nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import bindparam, func, insert, select
from sqlalchemy.exc import IntegrityError

from controller.state import models as m
from controller.state.db import Database

HOSTS = m.Host.__table__
INSERT_HOST = insert(HOSTS).values({c: bindparam(c) for c in ("name", "vtep_ip", "kind", "status", "last_seen",
                                                               "registered_at", "config_revision")})


def host(name: str, vtep: str) -> dict:
    return {"name": name, "vtep_ip": vtep, "kind": "hypervisor", "status": "up", "last_seen": m.now(),
            "registered_at": m.now(), "config_revision": 0}


def test_deferred_inserts_land_with_the_stamp(database: Database) -> None:
    db = database
    before = db.revision()
    with db.write(concurrent=True) as t:
        t.defer(INSERT_HOST, [host("hv1", "172.16.0.1"), host("hv2", "172.16.0.2")])
    with db.read() as s:
        rows = dict(s.execute(select(HOSTS.c.name, HOSTS.c.config_revision)).all())
        vteps = s.execute(select(m.Counter.value).where(m.Counter.name == "vteps")).scalar()
        entries = dict(s.execute(select(HOSTS.c.name, HOSTS.c.vtep_revision)).all())
    assert db.revision() == before + 1
    # stamped from the rows (controller/state/stamps.py), after the insert, in the same transaction: the hosts, their
    # VTEP entries and the VTEP list
    assert rows == {"hv1": before + 1, "hv2": before + 1} == entries and vteps == before + 1


def test_a_broken_constraint_fails_the_write_and_changes_nothing(database: Database) -> None:
    db = database
    with db.write() as t:
        t.defer(INSERT_HOST, host("hv1", "172.16.0.1"))
    before = db.revision()
    with pytest.raises(IntegrityError), db.write(concurrent=True) as t:
        t.session.add(m.Host(**host("hv3", "172.16.0.3")))  # an ordinary write before
        t.session.flush()
        t.defer(INSERT_HOST, [host("hv2", "172.16.0.2"), host("hv9", "172.16.0.1")])  # the VTEP is taken
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(HOSTS)).scalar() == 1
    assert db.revision() == before
