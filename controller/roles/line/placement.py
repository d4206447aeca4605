"""Where private lines' sessions run, written down (private_line_placements) so that it is sticky: a session stays
on its instance while that instance lives. Moving a session takes it down (the same link address cannot run on
two instances at once), so an instance coming back takes nothing back by itself; sessions move when their
instance dies (to the live one that weighs highest, placement.line_hosts) and when an operator rebalances a line
(`POST /v1/private-lines/{id}/rebalance`: from scratch, its sessions back on their rendezvous homes).

`settle` runs in the write that changes a private-line instance's liveness, role or existence, and in a line's
create; what it changes stamps the lines' VPCs (controller/state/stamps.py), so instances and vSwitches follow in the
same revision."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from controller.roles.line.sections import LINE_ROLE, live_line_instances
from controller.southbound.placement import line_hosts
from controller.state import models as m


def settle(s: Session, fresh: Collection[str] = (), only: Collection[str] | None = None) -> None:
    """Every line's placement (`only`: these lines'): kept where its instance is live, placed anew where not
    (`fresh`: these lines from scratch)."""
    live = live_line_instances(s)
    placements, lines = select(m.PrivateLinePlacement), select(m.PrivateLine.id, m.PrivateLine.secondary_local_ip)
    if only is not None:
        placements = placements.where(m.PrivateLinePlacement.line_id.in_(sorted(only)))
        lines = lines.where(m.PrivateLine.id.in_(sorted(only)))
    rows = {(p.line_id, p.session): p for p in s.execute(placements).scalars()}
    for line_id, secondary in s.execute(lines).tuples():
        n = 2 if secondary else 1
        old = [rows[(line_id, k)].instance if (line_id, k) in rows else None for k in range(n)]
        new = line_hosts(line_id, n, live, () if line_id in fresh else old)
        for k, inst in enumerate(new):
            row = rows.pop((line_id, k), None)
            if inst is None:
                if row is not None:
                    s.delete(row)
            elif row is None:
                s.add(m.PrivateLinePlacement(line_id=line_id, session=k, instance=inst))
            elif row.instance != inst:
                row.instance = inst
    for row in rows.values():  # a session the line no longer has
        s.delete(row)
    s.flush()


def instance_changed(s: Session, name: str, host: m.Host | None, was_line: bool = False) -> None:
    """After host `name`'s liveness, role or registration changed in this write (`host` None: deleted): if it is
    (or was) a private-line instance, the placements follow; one that went down or away also leaves its
    sessions' learned routes and reports behind (what it learned before it died must not route anything when it
    comes back)."""
    is_line = host is not None and host.kind == "gateway" and host.role == LINE_ROLE
    if not (is_line or was_line):
        return
    if host is None or host.status != "up" or not is_line:
        s.execute(delete(m.PrivateLineSession).where(m.PrivateLineSession.instance == name))
        for row in s.execute(select(m.PrivateLineLearned).where(m.PrivateLineLearned.instance == name)).scalars():
            s.delete(row)  # through the ORM: stamps the line's VPC
        s.flush()
    settle(s)


def placed_of(s: Session, line_id: str) -> list[str | None]:
    """The line's placement as written, by session (None: not placed)."""
    rows = dict(s.execute(select(m.PrivateLinePlacement.session, m.PrivateLinePlacement.instance)
                          .where(m.PrivateLinePlacement.line_id == line_id)).tuples().all())
    return [rows.get(0), rows.get(1)]
