"""A restore's new epoch (controller/state/backup.py): the revision past every one handed out before, every stamp
at it, and what only the replaced database had handed out treated as deleted at that revision."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Engine

from controller.state import models as m
from controller.state.change_log import ChangeLogEntry
from controller.state.table_base import now

STAMPED_COUNTERS = ("revision", "topology", "vteps")


@dataclass
class Live:
    """What the database a restore replaces has handed out."""

    revision: int = 0
    vnis: set[int] = field(default_factory=set)
    eips: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)


@dataclass
class Opened:
    revision: int
    vnis: list[int]
    eips: list[str]
    hosts: list[str]


def open_epoch(engine: Engine, backup_revision: int, live: Live | None, floor: int = 0, note: str = "") -> Opened:
    """In one transaction on the restored database; the audit log says so (`note`: which backup)."""
    live = live or Live()
    rev = max(backup_revision, live.revision, floor) + 1
    counters, vpcs, hosts = m.Counter.__table__, m.Vpc.__table__, m.Host.__table__
    with engine.begin() as c:
        have = set(c.execute(select(counters.c.name)).scalars())
        for name in STAMPED_COUNTERS:
            if name in have:
                c.execute(update(counters).where(counters.c.name == name).values(value=rev))
            else:
                c.execute(insert(counters).values(name=name, value=rev))
        c.execute(update(vpcs).values(revision=rev))
        c.execute(update(hosts).values(config_revision=rev, vtep_revision=rev))
        c.execute(delete(ChangeLogEntry.__table__))  # the replaced database's writes, and the backup's
        vnis = sorted(live.vnis - set(c.execute(select(vpcs.c.vni)).scalars()))
        eips = sorted(live.eips - set(c.execute(select(m.Eip.__table__.c.address)).scalars()))
        gone = sorted(live.hosts - set(c.execute(select(hosts.c.name)).scalars()))
        at = now()
        freed_v, freed_e, removed = m.FreedVni.__table__, m.FreedEip.__table__, m.RemovedHost.__table__
        if vnis:  # as a delete of their VPCs would: see controller/api/vpcs.py
            c.execute(delete(freed_v).where(freed_v.c.vni.in_(vnis)))
            c.execute(insert(freed_v), [{"vni": v, "freed_at": at} for v in vnis])
        if eips:  # as a release would: controller/api/eips.py
            c.execute(delete(freed_e).where(freed_e.c.address.in_(eips)))
            c.execute(insert(freed_e), [{"address": a, "freed_at": at} for a in eips])
        if gone:  # their VTEP entries go from every host's list, as a host delete's would
            c.execute(delete(removed).where(removed.c.name.in_(gone)))
            c.execute(insert(removed), [{"name": h, "revision": rev} for h in gone])
        c.execute(insert(m.AuditEntry.__table__).values(at=at, actor_kind="operator", actor="tianji controller restore",
                                                         method="RESTORE", path=note[:255], revision=rev))
    return Opened(rev, vnis, eips, gone)
