"""SQLite's stand-in for NOTIFY: every write's ChangeSet, at its revision, in the write's own transaction.

With several worker processes on one SQLite file, a worker learned of another's write only from the revision
counter (controller/southbound/watch.py polls it), without detail: every stream of every other worker then
recompiled. At 1,000 streams and 20 creates/s that was most of the workers' time (the last host at 1.8 s p99,
PostgreSQL 63 ms). The poll now reads what each write touched from here, as a NOTIFY payload carries it
(db.STAMP_NOTIFY), and wakes only the streams concerned. Kept for the last KEEP revisions: a poll further behind
rechecks everyone."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sqlalchemy import BigInteger, Text, delete, insert, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from controller.state.table_base import Base

if TYPE_CHECKING:  # stamps reads the models, which hold this table
    from controller.state.stamps import ChangeSet

KEEP = 4096  # revisions; the poll reads every 0.1 s, so only a stalled process is that far behind


class ChangeLogEntry(Base):
    __tablename__ = "change_log"
    revision: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    payload: Mapped[str] = mapped_column(Text)  # what NOTIFY would carry (watch.parse_notify reads both)


def payload(cs: ChangeSet) -> str:
    """The ChangeSet as db.STAMP_NOTIFY's payload."""
    return json.dumps({"r": cs.revision, "v": sorted(cs.vpcs), "h": sorted(cs.hosts), "t": cs.topology,
                       "e": cs.vteps_moved, "q": sorted(cs.traces)}, separators=(",", ":"))


def record(s: Session, cs: ChangeSet) -> None:
    """In the write's transaction: its entry, and the oldest one let go."""
    t = ChangeLogEntry.__table__
    s.execute(insert(t).values(revision=cs.revision, payload=payload(cs)))
    s.execute(delete(t).where(t.c.revision <= cs.revision - KEEP))


def after(s: Session, revision: int) -> list[tuple[int, str]]:
    """The entries after `revision`, oldest first."""
    t = ChangeLogEntry.__table__
    return list(s.execute(select(t.c.revision, t.c.payload).where(t.c.revision > revision)
                          .order_by(t.c.revision)).tuples())
